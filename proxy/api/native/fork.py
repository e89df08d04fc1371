"""POST /v1/traces/{trace_id}/fork: run a stored request again from one of its generated tokens.

    {"index": N, "token_id": ID} or {"index": N, "text": "..."}, optional max_tokens, temperature,
    top_p, top_k, seed (greedy by default)

The model reads the stored prompt ids, the tokens it generated before index N, then the replacement
instead of token N, and goes on from there on the backend serving now. The answer is shaped like a
non-streamed chat completion, and its `looptrace` field carries the new trace's id, the continuation
token by token and where it forked. The fork is traced as a request of its own, linked to the original.
"""

from __future__ import annotations

from typing import NamedTuple

from aiohttp import web

from looptrace.common import attributes as attr
from looptrace.common.jsonio import loads
from looptrace.common.vocabulary import AlternativeTexts
from looptrace.trace_store.records import request_span, span_named

from ...engine.request import StoredPrompt
from ...engine.runtime import Runtime
from ..errors import APIError, invalid
from ..keys import RUNTIME
from ..protocol import parse
from ..serving import traced
from ..stored import stored_trace
from ..validation import json_body
from .protocol import ForkRequest
from .stored_run import cache_salt_of, run_stored

DEFAULT_MAX_TOKENS = 1024  # when the original request said none


async def fork_trace(request: web.Request) -> web.Response:
    async with traced(request, attr.ENDPOINT_FORK) as trace:
        body = parse(ForkRequest, await json_body(request))
        index, token_id, text = _what(body)
        max_tokens = body.max_tokens
        runtime = request.app[RUNTIME]
        await runtime.ready()
        if not runtime.entry.can.fork:
            raise invalid(f"The {runtime.backend.name} backend cannot run a stored prompt again; a fork needs a backend "
                          "that decodes (--backend local, llama.cpp or vllm).", code="fork_unsupported")
        recorded = await stored_trace(request, request.match_info["trace_id"])
        original = _original(recorded, runtime)
        generated = original.generated
        if not 0 <= index < len(generated):
            raise invalid(f"'index' must point at a generated token: this trace generated {len(generated)}, "
                          f"so 0 to {len(generated) - 1}.", param="index")
        replacement = [_token(token_id, runtime)] if token_id is not None else _encode(text, runtime)
        prefix = generated[:index] + replacement
        stored = StoredPrompt(original.ids, original.thinking, original.forced + prefix,
                              typed=len(replacement) if text is not None else 0)
        room = runtime.max_model_len - len(stored.ids) - len(stored.answer_prefix)
        if room <= 0:
            raise invalid("The prompt and the tokens before the fork already fill the model's context.",
                          param="index", code="context_length_exceeded")
        if max_tokens is None:  # as long as the original answer could have run, from here, and fits
            max_tokens = min(max(1, (original.max_tokens or DEFAULT_MAX_TOKENS) - len(prefix)), room)
        trace.requested(runtime.model_name, stream=False, conversation=None)
        trace.checked()
        trace.forked(recorded, index, replacement)
        run = await run_stored(runtime, trace, stored, tools=original.tools, max_tokens=max_tokens,
                               temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, seed=body.seed,
                               cache_salt=cache_salt_of(request))
        AlternativeTexts(runtime.vocab).add_to(run.tokens)
        answer = run.answer
        answer["looptrace"] = {
            "trace_id": trace.trace_id, "forked_from": {"trace_id": recorded["trace_id"], "index": index},
            "prefix_ids": prefix, "replacement_ids": replacement,
            "tokens": run.tokens,
        }
        return web.json_response(answer)


def _what(body: ForkRequest) -> tuple[int, int | None, str | None]:
    index, token_id, text = body.index, body.token_id, body.text
    if (token_id is None) == (text is None):
        raise invalid("Give either 'token_id' (one of the alternatives) or 'text' to put at 'index'.",
                      param="token_id")
    if text is not None and not text:
        raise invalid("'text' must not be empty.", param="text")
    return index, token_id, text


class Original(NamedTuple):
    ids: list[int]  # the prompt as rendered, less a forced opening
    forced: list[int]  # a forced opening (tool_choice), which the answer starts with
    thinking: bool
    generated: list[int]
    tools: list[dict] | None
    max_tokens: int | None


def _original(trace: dict, runtime: Runtime) -> Original:
    """What the stored request ran, or a 4xx saying why this trace cannot be forked."""
    root = request_span(trace["spans"])
    attrs = root["attributes"] if root else {}
    model = attrs.get(attr.GEN_AI_REQUEST_MODEL)
    if model != runtime.model_name:
        raise APIError(409, f"This trace is of the model {model!r}; this server serves {runtime.model_name!r}, "
                       "whose tokens would mean something else.", param="trace_id", code="model_mismatch")
    render = span_named(trace, attr.SPAN_RENDER)["attributes"]
    tokens = span_named(trace, attr.SPAN_DECODE)["tokens"]
    if render.get(attr.PROMPT_MEDIA):
        raise invalid("This trace's prompt held images or audio, whose bytes a trace does not keep: its media tokens "
                      "alone would mean nothing to the model, so it cannot be run again.", param="trace_id",
                      code="trace_with_media")
    ids = render.get(attr.PROMPT_IDS)
    if ids is None or any("id" not in t for t in tokens):
        raise invalid("This trace was recorded with --no-trace-content: its token ids were not kept, so it "
                      "cannot be run again.", param="trace_id", code="trace_without_content")
    cut = len(ids) - render.get(attr.PROMPT_FORCED_TOKENS, 0)
    definitions = attrs.get(attr.GEN_AI_TOOL_DEFINITIONS)
    tools = [{"type": "function", "function": {k: d[k] for k in ("name", "description", "parameters") if k in d}}
             for d in loads(definitions)] if definitions else None
    return Original(ids[:cut], ids[cut:], bool(render.get(attr.PROMPT_THINKING)), [t["id"] for t in tokens],
                    tools, attrs.get(attr.GEN_AI_REQUEST_MAX_TOKENS))


def _token(token_id: int, runtime: Runtime) -> int:
    if not 0 <= token_id < len(runtime.vocab.pieces):
        raise invalid(f"'token_id' {token_id} is not in this model's vocabulary of {len(runtime.vocab.pieces)}.",
                      param="token_id")
    return token_id


def _encode(text: str, runtime: Runtime) -> list[int]:
    # Every control token typed here is text, as in a message: never a turn, a thought or a call.
    try:
        return runtime.family.encode_as_text(text)
    except ValueError as exc:  # a control token this vocabulary also makes from plain text
        raise invalid(f"'text' cannot be read as plain text: {exc}", param="text") from exc

