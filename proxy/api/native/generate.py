"""POST /v1/generate: a prompt of token ids decoded afresh (what `looptrace replay --mode step` asks).

    {"prompt_ids": [...], "thinking", "answer_prefix", "tools", "max_tokens", "temperature", "top_p",
     "top_k", "seed", "model"}

Parsed as a chat answer: its text, tool calls (each with its outcome) and finish reason, and every
token. Runs as a fork does (stored_run.py): greedy unless asked otherwise. Traced as a request of its own."""

from __future__ import annotations

from aiohttp import web

from looptrace.common import attributes as attr
from looptrace.common.jsonio import dumps

from ...engine.request import StoredPrompt
from ..errors import invalid
from ..openai.chat.request import tools_of
from ..protocol import parse
from ..serving import traced
from ..validation import json_body
from .protocol import GenerateRequest
from .stored_run import cache_salt_of, ready_for, run_stored, token_ids


async def generate(request: web.Request) -> web.Response:
    async with traced(request, attr.ENDPOINT_GENERATE) as trace:
        body = parse(GenerateRequest, await json_body(request))
        runtime = await ready_for(request, body.model, "fork", "decoding a prompt of token ids")
        prompt = token_ids(body.prompt_ids, "prompt_ids", runtime)
        prefix = token_ids(body.answer_prefix, "answer_prefix", runtime)
        if not prompt:
            raise invalid("'prompt_ids' must hold at least one token.", param="prompt_ids")
        thinking = body.thinking
        if thinking is None:  # as the family reads the prompt's end (Qwen3.5: `<think>` left open)
            thinking = runtime.family.prompt_leaves_thinking(runtime.tokenizer.decode(prompt[-8:]))
        tools = tools_of(body.tools)
        trace.requested(runtime.model_name, stream=False, conversation=None)
        trace.checked()
        run = await run_stored(runtime, trace, StoredPrompt(prompt, thinking, prefix), tools=tools,
                               max_tokens=body.max_tokens, temperature=body.temperature, top_p=body.top_p,
                               top_k=body.top_k, seed=body.seed, cache_salt=cache_salt_of(request))
        pieces = runtime.vocab.pieces
        for token in run.tokens:  # the alternatives' pieces: a replay records them as a decode span does
            token["top_pieces"] = [pieces[i] if 0 <= i < len(pieces) else "" for i in token["top_ids"]]
        answer = run.answer
        answer["looptrace"] = {
            "trace_id": trace.trace_id, "backend": runtime.backend.name, "prompt_tokens": len(prompt),
            "thinking": thinking, "tokens": run.tokens,
            "tool_calls": run.calls,
            "text": "".join(run.generation.text), "reasoning": "".join(run.generation.reasoning),
            "finish_reason": run.generation.finish_reason,
            "sampling": {"temperature": run.generation.sampling.temperature, "top_p": run.generation.sampling.top_p,
                         "top_k": run.generation.sampling.top_k, "seed": run.generation.sampling.seed},
        }
        return web.json_response(answer, dumps=dumps)
