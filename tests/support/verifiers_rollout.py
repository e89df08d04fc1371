"""A rollout collected by verifiers, an RL client library, with its own code: its environments
(`SingleTurnEnv`, or a `MultiTurnEnv` of three turns, a new user message after each answer), its OpenAI
Chat Completions client, and its own parsing of vLLM's `return_token_ids` and the logprobs (`from_native_response`, then
`parse_response_tokens` into each trajectory step's `tokens`). Prints each step's tokens as JSON.

Runs in verifiers' own environment (rl_clients.py builds it), not looptrace's:

    python verifiers_rollout.py BASE_URL MODEL single|turns PROMPT SAMPLING_JSON

(Not its ToolEnv against SmolLM2: verifiers sends a tool-calling answer back with `content: null`, which
SmolLM2's template, writing every content as a string, cannot render; vLLM makes it "" first.)
"""

from __future__ import annotations

import asyncio
import json
import sys

import verifiers as vf
from datasets import Dataset
from openai import AsyncOpenAI
from verifiers.clients.openai_chat_completions_client import OpenAIChatCompletionsClient

FOLLOW_UP = "Say that again in fewer words."


class Conversation(vf.MultiTurnEnv):
    """Three turns: each answer is followed by the same new user message."""

    async def env_response(self, messages, state, **kwargs):
        return [{"role": "user", "content": FOLLOW_UP}]


async def main(base_url: str, model: str, kind: str, prompt: str, sampling: dict) -> dict:
    dataset = Dataset.from_list([{"question": prompt, "answer": ""}])
    env = Conversation(max_turns=3, dataset=dataset) if kind == "turns" else vf.SingleTurnEnv(dataset=dataset)
    client = OpenAIChatCompletionsClient(AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0))
    rollout_input = {"prompt": [{"role": "user", "content": prompt}], "example_id": 0}
    state = await env.rollout(rollout_input, client, model, sampling)
    steps = []
    for step in state["trajectory"]:
        tokens = step["tokens"]
        steps.append({"tokens": None if tokens is None else {
            k: tokens[k] for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask",
                                   "completion_logprobs")},
            "content": step["completion"][-1].content})
    error = state.get("error")
    return {"steps": steps, "error": None if error is None else f"{error!r}: {error.__cause__!r}"}


if __name__ == "__main__":
    url, name, kind, text, settings = sys.argv[1:6]
    print(json.dumps(asyncio.run(main(url, name, kind, text, json.loads(settings)))))
