"""What every generating endpoint (/v1/chat/completions, /v1/responses, /v1/messages, the Gemini API's
:generateContent) does around its own format: trace the request from arrival to end, check the model,
and prepare the generation, so that every refusal leaves before a byte of the answer; the count_tokens
endpoints prepare one untraced. Then, for an answer that is one stream or one body and nothing more
(Messages, the Gemini API), run it: `streamed` or `collected`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from typing import Protocol

from aiohttp import web
from opentelemetry.propagate import extract

from ..engine.continuity import MODES
from ..engine.generation import Generation
from ..engine.request import GenerationRequest, Step
from ..observe.telemetry import RequestTelemetry
from looptrace.common import attributes as attr

from .auth import caller_of, tenant_of, within
from .budgets import BUDGETS
from .agents import line_of
from .clients import agent_attributes, request_attributes, rollout_of, session_of, weight_version
from .errors import failure_of, invalid, model_not_found
from .history_sessions import HISTORY
from .keys import CACHE_SALTS, HISTORY_SESSIONS, MEMORY, RUNTIME, TELEMETRY
from .media_fetch import fetch_media
from .streaming import Framing, StreamFormat, relay


@asynccontextmanager
async def traced(http: web.Request, endpoint: str, attributes: dict | None = None,
                 continued: bool = True) -> AsyncIterator[RequestTelemetry]:
    """The request's trace and metrics, for as long as its handler runs; an incoming traceparent is continued.
    `attributes`: more for the server span (a WebSocket turn's transport); `continued` False: a trace of
    its own whatever the headers say (a WebSocket's turns, which share its upgrade's headers)."""
    tenant = tenant_of(http)
    trace = http.app[TELEMETRY].start_request(endpoint, extract(http.headers) if continued else None,
                                              {**request_attributes(http.method, http.path, http.headers),
                                               **({attr.TENANT: tenant} if tenant is not None else {}),
                                               **(attributes or {})})
    spending = None
    try:
        spending = await http.app[BUDGETS].admit(caller_of(http))  # a 429 here: the key's budget is spent
        if spending is not None:
            trace.observers = (*trace.observers, spending)  # what the request's generations read and wrote
        yield trace
    except BaseException as exc:
        trace.fail(*failure_of(exc))
        raise
    finally:
        try:
            if spending is not None:
                await spending.end()  # the turn's tokens charged to its key
        finally:
            trace.end()


async def prepared(http: web.Request, trace: RequestTelemetry | None, body: dict, request: GenerationRequest, *,
                   model: str, stream: bool, conversation: str | None = None) -> Generation:
    """The generation, rendered and checked against the context: ready to run. `trace` None: a prompt
    prepared only to be counted (count_tokens), neither traced nor taken as its conversation's turn.
    `conversation`: the conversation when the client names none (a WebSocket's lane)."""
    caller = caller_of(http)
    request.cache_salt = http.app[CACHE_SALTS].of(caller.tenant)  # no prefix cache reuse across tenants
    if trace is not None:
        rollout, group = rollout_of(http.match_info, http.headers)
        weight_version(http.headers)
        session, grouped_by = session_for(http, trace, request, body, rollout, conversation)
        # Each agent of the session is its own conversation line (agents.py): every reader of
        # request.conversation (continuity, memory, render cache, compaction) keeps agents apart.
        request.conversation = line_of(session, agent_attributes(http.headers))
        rollout = within(caller.tenant, rollout)
        request.continuity = continuity_asked(http.headers, body)
        if request.conversation is not None:  # its last turn is read while this one is prepared
            request.memory = http.app[MEMORY].recall(request.conversation, trace.trace_id)
        trace.requested(model, stream=stream, conversation=session, line=request.conversation, group=group,
                        rollout=bool(rollout))
        if grouped_by is not None:
            trace.grouped(grouped_by)
    runtime = http.app[RUNTIME]
    await runtime.ready()
    if model != runtime.model_name or not caller.may_use(model):
        raise model_not_found(model, runtime.model_name if caller.may_use(runtime.model_name) else None)
    if trace is not None:
        trace.checked()
    settings = runtime.settings
    await fetch_media(request.media, frozenset(h.lower() for h in settings.allowed_media_domains),
                      runtime.media_limits, settings.media_fetch_timeout)
    generation = Generation(runtime, request, trace.observers if trace is not None else ())
    await generation.prepare()
    return generation


def session_for(http: web.Request, trace: RequestTelemetry, request: GenerationRequest, body: dict,
                rollout: str | None, conversation: str | None) -> tuple[str | None, str | None]:
    """The request's session, within the caller's tenant (another's of the same name shares nothing
    with it), and how it was found (None: a rollout's, or a WebSocket lane's). One that names none
    continues the session its history extends (history_sessions.py), or starts one: None here, its
    trace id its key in the store."""
    tenant = caller_of(http).tenant
    named, how = session_of(http.headers, body)
    if rollout or (conversation and not named):
        return within(tenant, rollout or conversation), None
    if named:
        return within(tenant, named), how
    if trace.trace_id is None:  # kept nowhere: no session to join
        return None, None
    grouping = http.app[HISTORY_SESSIONS].join(tenant, request.messages, trace.trace_id)
    trace.observers = (*trace.observers, grouping)  # its answer kept, for the turn that extends it
    # A key from this tenant's own map ("trace:" and a step's trace id), so not prefixed again.
    return (grouping.session if grouping.joined else None), HISTORY


def continuity_asked(headers, body: dict) -> str | None:
    """The token continuity a request asks for (X-Token-Continuity, or a `token_continuity` field:
    extra_body to the openai SDK), None for the server's; a 400 for another value."""
    asked = headers.get("X-Token-Continuity", body.get("token_continuity"))
    if asked is not None and asked not in MODES:
        raise invalid(f"'token_continuity' must be one of {', '.join(MODES)}.", param="token_continuity")
    return asked


class Answering(StreamFormat, Protocol):
    """A stream format whose answer has its id before its first event (MessageStream, ContentStream)."""

    id: str


class Collector(Protocol):
    """A whole answer, built as the generation runs (MessageCollector, ContentCollector)."""

    id: str

    def add(self, step: Step) -> None:
        """What a step of the generation adds to the answer."""

    def body(self, generation: Generation) -> dict:
        """The answer's JSON, once the generation ended."""


async def streamed(http: web.Request, trace: RequestTelemetry, generation: Generation, stream: Answering,
                   sink: Framing | None = None) -> web.StreamResponse:
    """The prepared generation streamed as `stream`'s events (into `sink` where given: see relay), its
    answer's id on the trace first. However it ends, the generation stops: a client that went away
    stops its generation."""
    try:
        trace.responded(stream.id)
        return await relay(http, generation, stream, trace, sink=sink)
    finally:
        generation.cancel()


async def collected(trace: RequestTelemetry, generation: Generation, collector: Collector) -> web.Response:
    """The prepared generation run to its end into `collector`, and answered whole as its body; the
    generation stops however this ends, as a stream's does."""
    try:
        async with aclosing(generation.run()) as steps:
            async for step in steps:
                collector.add(step)
        trace.responded(collector.id)
        return web.json_response(collector.body(generation))
    finally:
        generation.cancel()
