"""A prompt that is token ids already run on the backend serving now and collected whole: what a
fork (fork.py: a stored trace's prompt and the tokens before the fork) and POST /v1/generate
(generate.py: a prompt a replay sends) share. No rendering: the ids go to the model as they are."""

from __future__ import annotations

from contextlib import aclosing
from typing import NamedTuple

from aiohttp import web

from looptrace.families.deltas import ToolCallDelta, UnparsedCallDelta

from ...engine.generation import Generation
from ...engine.observer import Observer
from ...engine.request import GenerationRequest, StoredPrompt
from ...engine.runtime import Runtime
from ...observe.telemetry import RequestTelemetry
from ..auth import tenant_of
from ..errors import invalid, model_not_found
from ..keys import CACHE_SALTS, RUNTIME
from ..openai.chat.response import ChatCollector


class Run(NamedTuple):
    answer: dict  # a chat completion of the whole answer (ChatCollector's)
    tokens: list[dict]  # every generated token event, with its channel
    calls: list[dict]  # every tool call as the parser ended it, in one shape: parsed (its outcome) or unparsed
    generation: Generation


class _Calls(Observer):
    """The tool calls the parser ended, unparsed ones too (a Generation keeps the parsed ones only)."""

    def __init__(self) -> None:
        self.seen: list[dict] = []

    def tool_call(self, delta: ToolCallDelta) -> None:
        self.seen.append({key: delta[key] for key in ("index", "id", "name", "arguments", "raw", "outcome")})

    def unparsed_call(self, delta: UnparsedCallDelta) -> None:
        self.seen.append({"outcome": "unparsed", "raw": delta["raw"]})


async def run_stored(runtime: Runtime, trace: RequestTelemetry, stored: StoredPrompt, *, tools: list[dict] | None,
                     max_tokens: int, temperature: float | None, top_p: float | None, top_k: int | None,
                     seed: int | None, cache_salt: str | None = None) -> Run:
    """Refusals (a max_tokens past what fits: Chat's 400) come before anything runs. `cache_salt`: the
    caller's tenant's (cache_salt_of)."""
    calls = _Calls()
    generation = Generation(runtime, GenerationRequest(
        messages=[], tools=tools, max_tokens=max_tokens, stored=stored,
        temperature=0.0 if temperature is None else temperature, top_p=top_p, top_k=top_k, seed=seed,
        cache_salt=cache_salt),
        (*trace.observers, calls))
    await generation.prepare()
    collector = ChatCollector(runtime.model_name, None)
    tokens: list[dict] = []
    try:
        async with aclosing(generation.run()) as steps:
            async for step in steps:
                collector.add(step)
                if step.token is not None:
                    tokens.append({**step.token, "channel": step.channel})
    finally:
        generation.cancel()
    answer = collector.body(generation)
    trace.responded(answer["id"])
    return Run(answer, tokens, calls.seen, generation)


def cache_salt_of(request: web.Request) -> str | None:
    """The salt of the caller's tenant, for the prefix caches (api/cache_salts.py): as every API's request."""
    return request.app[CACHE_SALTS].of(tenant_of(request))


def token_ids(ids: list[int] | None, key: str, runtime: Runtime) -> list[int]:
    """`ids` (the body's `key`, integers already), each in the served model's vocabulary, or a 400 naming it."""
    ids = ids or []
    known = len(runtime.vocab.pieces)
    for n, token in enumerate(ids):
        if not 0 <= token < known:
            raise invalid(f"'{key}[{n}]' must be a token id of this model's vocabulary of {known}.",
                          param=f"{key}[{n}]")
    return ids


async def ready_for(request: web.Request, model: str | None, capability: str, what: str) -> Runtime:
    """The runtime, once loaded, when its backend can do `capability` and `model` (if given) is the one served."""
    runtime: Runtime = request.app[RUNTIME]
    await runtime.ready()
    if model is not None and model != runtime.model_name:
        raise model_not_found(model, runtime.model_name)
    if not getattr(runtime.entry.can, capability):
        raise invalid(f"The {runtime.backend.name} backend cannot do {what}; it needs a backend with a model "
                      "(--backend local, llama.cpp or vllm).", code=f"{capability}_unsupported")
    return runtime
