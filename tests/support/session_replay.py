"""The agent session bench/speculative.py replays (bench/speculative_session.json: a coding task with
SmolLM2's own answers), turn by turn, for the tests: each assistant turn's prompt, rendered with the
model's chat template, and the backend's greedy answer to it with every token's report."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from looptrace.backends.base import DecodeRequest, SamplingParams

SESSION = Path(__file__).resolve().parents[2] / "bench" / "speculative_session.json"


def turn_prompts(tokenizer, turns: int) -> list[list[int]]:
    """The first `turns` assistant turns' prompts: the conversation before each."""
    messages = json.loads(SESSION.read_text())["messages"]
    ends = [i for i, message in enumerate(messages) if message["role"] == "assistant"][:turns]
    return [tokenizer.apply_chat_template(messages[:end], add_generation_prompt=True, tokenize=True,
                                          return_dict=True)["input_ids"] for end in ends]


def answer(backend, prompt: list[int], tokens: int, stop: frozenset, conversation: str) -> tuple[list[dict], dict]:
    """(the token events, the done event) of a greedy answer."""
    async def run():
        request = DecodeRequest(prompt, tokens, SamplingParams(temperature=0), stop, conversation=conversation)
        return [event async for event in backend.generate(request)]

    events = asyncio.run(run())
    return [e for e in events if e["type"] == "token"], events[-1]


def first_difference(a: list[dict], b: list[dict]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x["id"] != y["id"]:
            return i
    return None
