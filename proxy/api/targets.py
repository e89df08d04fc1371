"""What a replay asks of a looptrace server it replays a session against (`looptrace replay --target`):

    POST /v1/score     {"prompt_ids": [...], "answer_ids": [...]}
                       each answer token's logprob, rank and the model's greedy choice, read in one
                       prefill (the backend's `score`, teacher forced: nothing generated)
    POST /v1/generate  {"prompt_ids": [...], "thinking", "answer_prefix", "tools", "max_tokens",
                       "temperature", "top_p", "top_k", "seed"}
                       the prompt decoded afresh, parsed as a chat answer: its text, tool calls
                       (each with its outcome) and finish reason, and every token

Both take token ids in the served model's vocabulary (a replay sends a recorded prompt as it was,
never re-tokenized) and an optional `model`, which must be the one served. Each is traced as a
request of its own. A generation runs as a fork does (stored_run.py): greedy unless asked otherwise.
"""

from __future__ import annotations

from aiohttp import web

from looptrace.common import attributes as attr
from looptrace.common.jsonio import dumps

from ..engine.request import StoredPrompt
from ..engine.runtime import Runtime
from .errors import invalid, model_not_found
from .keys import RUNTIME
from .openai.chat_request import parse_tools
from .openai.request_parts import at_most, seed, temperature_and_top_p
from .serving import traced
from .stored_run import run_stored, token_ids
from .validation import field, in_range, json_body


async def score(request: web.Request) -> web.Response:
    async with traced(request, attr.ENDPOINT_SCORE) as trace:
        body = await json_body(request)
        runtime = await _ready(request, body, "score", "scoring")
        trace.requested(runtime.model_name, stream=False, conversation=None)
        trace.checked()
        prompt, answer = token_ids(body, "prompt_ids", runtime), token_ids(body, "answer_ids", runtime)
        if not prompt or not answer:
            raise invalid("'prompt_ids' and 'answer_ids' must each hold at least one token.",
                          param="prompt_ids" if not prompt else "answer_ids")
        if len(prompt) + len(answer) - 1 > runtime.max_model_len:
            raise invalid(f"{len(prompt)} prompt tokens and {len(answer)} answer tokens do not fit in this model's "
                          f"context of {runtime.max_model_len}.", param="answer_ids", code="context_length_exceeded")
        scores = await runtime.backend.score(prompt, answer)
        pieces = runtime.vocab.pieces
        return web.json_response({
            "object": "score", "model": runtime.model_name, "trace_id": trace.trace_id,
            "backend": runtime.backend.name,
            # Each token's piece, so a caller can tell that the ids mean in this vocabulary what they meant in its own.
            "tokens": [{**s, "piece": pieces[s["id"]], "greedy_piece": pieces[s["greedy_id"]]} for s in scores],
        }, dumps=dumps)


async def generate(request: web.Request) -> web.Response:
    async with traced(request, attr.ENDPOINT_GENERATE) as trace:
        body = await json_body(request)
        runtime = await _ready(request, body, "fork", "decoding a prompt of token ids")
        prompt, prefix = token_ids(body, "prompt_ids", runtime), token_ids(body, "answer_prefix", runtime, required=False)
        if not prompt:
            raise invalid("'prompt_ids' must hold at least one token.", param="prompt_ids")
        thinking = field(body, "thinking", bool, "thinking")
        if thinking is None:  # as the family reads the prompt's end (Qwen3.5: `<think>` left open)
            thinking = runtime.family.prompt_leaves_thinking(runtime.tokenizer.decode(prompt[-8:]))
        tools = parse_tools(at_most(field(body, "tools", list, "tools") or [], "tools", "tools"))
        max_tokens = field(body, "max_tokens", int, "max_tokens")
        in_range(max_tokens, "max_tokens", 1)
        temperature, top_p = temperature_and_top_p(body)
        top_k = field(body, "top_k", int, "top_k")
        in_range(top_k, "top_k", -1)
        trace.requested(runtime.model_name, stream=False, conversation=None)
        trace.checked()
        run = await run_stored(runtime, trace, StoredPrompt(prompt, thinking, prefix), tools=tools,
                               max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                               seed=seed(body))
        pieces = runtime.vocab.pieces
        for token in run.tokens:  # the alternatives' pieces: a replay records them as a decode span does
            token["top_pieces"] = [pieces[i] if 0 <= i < len(pieces) else "" for i in token["top_ids"]]
        answer = run.answer
        answer["looptrace"] = {
            "trace_id": trace.trace_id, "backend": runtime.backend.name, "prompt_tokens": len(prompt),
            "thinking": thinking, "tokens": run.tokens,
            "tool_calls": [_call(c) for c in run.calls],
            "text": "".join(run.generation.text), "reasoning": "".join(run.generation.reasoning),
            "finish_reason": run.generation.finish_reason,
            "sampling": {"temperature": run.generation.sampling.temperature, "top_p": run.generation.sampling.top_p,
                         "top_k": run.generation.sampling.top_k, "seed": run.generation.sampling.seed},
        }
        return web.json_response(answer, dumps=dumps)


async def _ready(request: web.Request, body: dict, capability: str, what: str) -> Runtime:
    """The runtime, once loaded, when its backend can do `capability` and `model` (if given) is the one served."""
    runtime: Runtime = request.app[RUNTIME]
    model = field(body, "model", str, "model")
    await runtime.ready()
    if model is not None and model != runtime.model_name:
        raise model_not_found(model, runtime.model_name)
    if not getattr(runtime.entry.can, capability):
        raise invalid(f"The {runtime.backend.name} backend cannot do {what}; it needs a backend with a model "
                      "(--backend local, llama.cpp or vllm).", code=f"{capability}_unsupported")
    return runtime


def _call(delta: dict) -> dict:
    """A tool call as the parser ended it, in one shape whatever its outcome."""
    if delta["type"] == "tool_call_unparsed":
        return {"outcome": "unparsed", "raw": delta["raw"]}
    return {key: delta[key] for key in ("index", "id", "name", "arguments", "raw", "outcome")}
