"""The embedded store over HTTP: GET /v1/traces, /v1/traces/{trace_id}, /v1/traces/{trace_id}/prompt."""

from __future__ import annotations

import asyncio
import functools
import math
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

from aiohttp import web

from looptrace.common import attributes as attr
from looptrace.common.jsonio import dumps
from looptrace.common.vocabulary import Vocabulary
from looptrace.trace_store.records import request_span
from looptrace.trace_store.sqlite.store import SQLiteTraceStore

from ..errors import APIError, invalid
from ..validation import query_int, query_number
from ..keys import RUNTIME, TELEMETRY
from .prompt_view import AlternativeTexts, prompt_view, with_alternative_texts


async def list_traces(request: web.Request) -> web.Response:
    store = store_of(request)
    query = request.query
    limit = query_int(query.get("limit", "50"), "limit", 1, 1000)
    since = timestamp(query.get("since"), "since")
    before = cursor(query.get("before"))
    page = await read(store.list_traces, {"data": [], "next": None}, conversation=query.get("conversation"),
                      model=query.get("model"), since_ns=since, before=before, limit=limit)
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
    found = await read(store_of(request).tokens, None, trace_id)
    if found is None:
        raise APIError(404, f"No trace {trace_id} in the store (it may not be written yet, or was retired).",
                       param="trace_id", code="trace_not_found")
    runtime = request.app[RUNTIME]
    if runtime.status == "ready" and found["model"] == runtime.model_name:
        await on_viewer_thread(AlternativeTexts(runtime.vocab).add_to, found["tokens"])
    return web.json_response(found, dumps=dumps)


async def get_prompt(request: web.Request) -> web.Response:
    """The prompt token by token, and with `?against=TRACE_ID` (the step before) what changed since."""
    trace = await stored_trace(request, request.match_info["trace_id"])
    against = request.query.get("against")
    previous = await stored_trace(request, against, param="against") if against else None
    view = await on_viewer_thread(prompt_view, trace, previous, vocabulary_for(request, trace))
    return web.json_response(view, dumps=dumps)


def vocabulary_for(request: web.Request, trace: dict) -> Vocabulary | None:
    """The tokenizer a trace's ids mean something in: the served model's, if the trace is of it."""
    runtime = request.app[RUNTIME]
    root = request_span(trace["spans"])
    model = root["attributes"].get(attr.GEN_AI_REQUEST_MODEL) if root else None
    return runtime.vocab if runtime.status == "ready" and model == runtime.model_name else None


async def stored_trace(request: web.Request, trace_id: str, param: str = "trace_id") -> dict:
    found = await read(store_of(request).get_trace, None, trace_id.lower())
    if found is None:
        raise APIError(404, f"No trace {trace_id} in the store (it may not be written yet, or was retired).",
                       param=param, code="trace_not_found")
    return found


# The viewer's reads, and the work on what they read, run on threads of their own, a few at most: a
# slow search (or eight) then waits for the viewer's threads, never for those serving requests (a long
# prompt renders on the event loop's default pool), and holds at most this many cores.
VIEWER_THREADS = 4
_VIEWER_POOL = ThreadPoolExecutor(VIEWER_THREADS, thread_name_prefix="looptrace-viewer")


async def on_viewer_thread(function, *args, **kwargs):
    return await asyncio.get_running_loop().run_in_executor(_VIEWER_POOL, functools.partial(function, *args, **kwargs))


async def read(query, empty, *args, **kwargs):
    """A store query on the viewer's threads; a store with nothing written yet reads as `empty`, and one
    that cannot be read (not a database, a directory, locked) is a 503 that says why."""
    try:
        return await on_viewer_thread(query, *args, **kwargs)
    except FileNotFoundError:
        return empty
    except (sqlite3.Error, OSError) as exc:
        store = getattr(query, "__self__", None)
        raise APIError(503, f"The trace store at {getattr(store, 'path', '?')} cannot be read: {exc}",
                       type="server_error", code="trace_store_unreadable") from exc


def store_of(request: web.Request) -> SQLiteTraceStore:
    store = request.app[TELEMETRY].store
    if store is None:
        raise APIError(404, "The trace store is off (--trace-db off).", code="trace_store_off")
    return store


def cursor(value: str | None) -> tuple[int, str] | None:
    """`?before=`: the `next` of a previous page, "NANOSECONDS:KEY"."""
    if not value:
        return None
    stamp, _, key = value.partition(":")
    if not (stamp.isascii() and stamp.isdigit()) or len(stamp) > 19 or int(stamp) >= 1 << 63 or not key:
        raise invalid("'before' must be the 'next' value of a previous page.", param="before")
    return int(stamp), key


MAX_SECONDS = (1 << 63) / 1e9  # nanoseconds past this do not fit SQLite's 64-bit integers (year 2262)


def timestamp(value: str | None, name: str) -> int | None:
    """Unix seconds or an ISO 8601 time → nanoseconds."""
    if not value:
        return None
    seconds = query_number(value, name)
    if seconds is None:
        try:
            if not value.isascii():  # fromisoformat reads other scripts' digits too
                raise ValueError(value)
            seconds = datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except (ValueError, OverflowError):
            raise invalid(f"'{name}' must be Unix seconds or an ISO 8601 time.", param=name) from None
    if not (math.isfinite(seconds) and 0 <= seconds < MAX_SECONDS):
        raise invalid(f"'{name}' must be Unix seconds or an ISO 8601 time between 1970 and 2262.", param=name)
    return int(seconds * 1e9)
