"""Reading the trace store from a handler, for every API package: the store (a 404 when it is off),
its queries run off the event loop, and the two answers a store that cannot answer gets (nothing
written yet: empty; unavailable: a 503 that says why).

A store raises `StoreUnavailable` (trace_store/interface.py) whatever its driver, so nothing here
names SQLite or PostgreSQL.
"""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

from looptrace.trace_store.interface import StoreUnavailable, TraceStore

from .auth import sees
from .errors import APIError
from .keys import TELEMETRY

# The viewer's reads, and the work on what they read, run on threads of their own, a few at most: a
# slow search (or eight) then waits for the viewer's threads, never for those serving requests (a long
# prompt renders on the event loop's default pool), and holds at most this many cores.
VIEWER_THREADS = 4
_VIEWER_POOL = ThreadPoolExecutor(VIEWER_THREADS, thread_name_prefix="looptrace-viewer")


def store_of(request: web.Request) -> TraceStore:
    store = request.app[TELEMETRY].store
    if store is None:
        raise APIError(404, "The trace store is off (--trace-db off).", code="trace_store_off")
    return store


async def on_viewer_thread(function, *args, **kwargs):
    return await asyncio.get_running_loop().run_in_executor(_VIEWER_POOL, functools.partial(function, *args, **kwargs))


async def read(query, empty, *args, **kwargs):
    """A store query on the viewer's threads; a store with nothing written yet reads as `empty`, and one
    that cannot be read (not a database, a directory, locked, down) is a 503 that says why."""
    try:
        return await on_viewer_thread(query, *args, **kwargs)
    except FileNotFoundError:
        return empty
    except (StoreUnavailable, OSError) as exc:
        store = getattr(query, "__self__", None)
        raise APIError(503, f"The trace store at {getattr(store, 'where', '?')} cannot be read: {exc}",
                       type="server_error", code="trace_store_unreadable") from exc


async def on_store(function, *args):
    """A write or read of the state beside the store (rollouts, rewards) off the event loop; a store
    that fails is a 503 that says why."""
    try:
        return await asyncio.to_thread(function, *args)
    except (StoreUnavailable, OSError) as exc:
        raise APIError(503, f"The rollouts store cannot be used: {exc}", type="server_error",
                       code="trace_store_unreadable") from exc


async def stored_trace(request: web.Request, trace_id: str, param: str = "trace_id") -> dict:
    """A trace the caller may read (another tenant's is as unknown), or a 404."""
    found = await read(store_of(request).get_trace, None, trace_id.lower(), sees(request))
    if found is None:
        raise APIError(404, f"No trace {trace_id} in the store (it may not be written yet, or was retired).",
                       param=param, code="trace_not_found")
    return found
