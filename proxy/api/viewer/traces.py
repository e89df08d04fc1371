"""The embedded store over HTTP: GET /v1/traces, /v1/traces/{trace_id}, /v1/traces/{trace_id}/prompt."""

from __future__ import annotations

from aiohttp import web

from looptrace.common import attributes as attr
from looptrace.common.jsonio import dumps
from looptrace.common.vocabulary import AlternativeTexts, Vocabulary
from looptrace.trace_store.records import request_span

from ..auth import sees
from ..errors import APIError
from ..keys import RUNTIME
from ..query import Cursor, Query, Time, between
from ..stored import on_viewer_thread, read, store_of, stored_trace
from .prompt_view import prompt_view, with_alternative_texts


class TracesQuery(Query):
    limit: between(1, 1000) = 50
    since: Time = None
    before: Cursor = None
    conversation: str | None = None
    model: str | None = None


async def list_traces(request: web.Request) -> web.Response:
    store = store_of(request)
    query = TracesQuery.of(request)
    page = await read(store.list_traces, {"data": [], "next": None}, conversation=query.conversation,
                      model=query.model, since_ns=query.since, before=query.before, limit=query.limit,
                      tenant=sees(request))
    return web.json_response({"object": "list", **page}, dumps=dumps)


async def get_trace(request: web.Request) -> web.Response:
    """One trace, every span; the decode span's tokens one by one, with their alternatives' text when
    the trace is of the model served (its tokenizer reads them)."""
    trace = await stored_trace(request, request.match_info["trace_id"])
    vocab = vocabulary_for(request, trace)
    if vocab is not None:
        trace = await on_viewer_thread(with_alternative_texts, trace, vocab)
    return web.json_response(trace, dumps=dumps)


async def get_tokens(request: web.Request) -> web.Response:
    """A trace's generated tokens alone, with their alternatives' text: what the viewer's heat map reads."""
    trace_id = request.match_info["trace_id"].lower()
    found = await read(store_of(request).tokens, None, trace_id, sees(request))
    if found is None:
        raise APIError(404, f"No trace {trace_id} in the store (it may not be written yet, or was retired).",
                       param="trace_id", code="trace_not_found")
    runtime = request.app[RUNTIME]
    if runtime.status == "ready" and found["model"] == runtime.model_name:
        await on_viewer_thread(AlternativeTexts(runtime.vocab).add_to, found["tokens"])
    return web.json_response(found, dumps=dumps)


class PromptQuery(Query):
    against: str = ""  # the trace of the step before


async def get_prompt(request: web.Request) -> web.Response:
    """The prompt token by token, and with `?against=TRACE_ID` (the step before) what changed since."""
    trace = await stored_trace(request, request.match_info["trace_id"])
    against = PromptQuery.of(request).against
    previous = await stored_trace(request, against, param="against") if against else None
    view = await on_viewer_thread(prompt_view, trace, previous, vocabulary_for(request, trace))
    return web.json_response(view, dumps=dumps)


def vocabulary_for(request: web.Request, trace: dict) -> Vocabulary | None:
    """The tokenizer a trace's ids mean something in: the served model's, if the trace is of it."""
    runtime = request.app[RUNTIME]
    root = request_span(trace["spans"])
    model = root["attributes"].get(attr.GEN_AI_REQUEST_MODEL) if root else None
    return runtime.vocab if runtime.status == "ready" and model == runtime.model_name else None
