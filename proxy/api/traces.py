"""GET /v1/traces and /v1/traces/{trace_id}: the embedded store, queried over HTTP."""

from __future__ import annotations

import asyncio
from datetime import datetime

from aiohttp import web

from looptrace.backends.jsontext import dumps

from .errors import APIError, invalid
from .keys import TELEMETRY


async def list_traces(request: web.Request) -> web.Response:
    store = _store(request)
    query = request.query
    limit = _int(query.get("limit", "50"), "limit")
    if not 1 <= limit <= 1000:
        raise invalid("'limit' must be between 1 and 1000.", param="limit")
    since = _since(query.get("since"))
    try:
        rows = await asyncio.to_thread(store.list_traces, conversation=query.get("conversation"),
                                       model=query.get("model"), since_ns=since, limit=limit)
    except FileNotFoundError:
        rows = []  # nothing recorded yet
    return web.json_response({"object": "list", "data": rows}, dumps=dumps)


async def get_trace(request: web.Request) -> web.Response:
    store = _store(request)
    trace_id = request.match_info["trace_id"].lower()
    try:
        found = await asyncio.to_thread(store.get_trace, trace_id)
    except FileNotFoundError:
        found = None
    if found is None:
        raise APIError(404, f"No trace {trace_id} in the store (it may not be written yet, or was retired).",
                       param="trace_id", code="trace_not_found")
    return web.json_response(found, dumps=dumps)


def _store(request: web.Request):
    store = request.app[TELEMETRY].store
    if store is None:
        raise APIError(404, "The trace store is off (--trace-db off).", code="trace_store_off")
    return store


def _int(value: str, name: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise invalid(f"'{name}' must be an integer.", param=name) from None


def _since(value: str | None) -> int | None:
    """Unix seconds or an ISO 8601 time → nanoseconds."""
    if not value:
        return None
    try:
        return int(float(value) * 1e9)
    except ValueError:
        pass
    try:
        return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1e9)
    except ValueError:
        raise invalid("'since' must be Unix seconds or an ISO 8601 time.", param="since") from None

