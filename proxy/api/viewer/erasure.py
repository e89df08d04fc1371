"""DELETE /v1/sessions/{key}: a session erased, everything derived from it (trace_store/erasure.py), in
the server's own store, its writer held meanwhile; GET /v1/erasures: the erasures made (who, what,
when, rows removed: never content).

A tenant's key (scope `erase`) erases its tenant's sessions alone: another tenant's session is erased
as one never stored (nothing goes; the same 404, the erasure recorded alike), and it lists its tenant's
erasures alone. The operator's erase any session and list every erasure. Who erased is the key's name."""

from __future__ import annotations

from aiohttp import web

from looptrace.common.jsonio import dumps
from looptrace.trace_store import erasure

from ..auth import caller_of, sees
from ..errors import APIError
from ..keys import TELEMETRY
from ..query import Query, between
from ..stored import on_viewer_thread, store_of
from .sessions import SessionKey, session_key


def _state(request: web.Request):
    state = request.app[TELEMETRY].state
    if state is None:
        raise APIError(404, "The trace store is off (--trace-db off).", code="trace_store_off")
    return state


async def _run(function, *args):
    """On the viewer's threads; a store that fails (locked past its wait, down) is a 503 that says why."""
    try:
        return await on_viewer_thread(function, *args)
    except Exception as exc:  # noqa: BLE001 - either driver's error, or StoreUnavailable: said, not a 500
        if isinstance(exc, APIError):
            raise
        raise APIError(503, f"The trace store cannot erase now: {str(exc).strip() or type(exc).__name__}",
                       type="server_error", code="trace_store_unavailable") from exc


async def erase_session(request: web.Request) -> web.Response:
    key = session_key(request, SessionKey.of(request).key, "DELETE /v1/sessions/{key}")
    store, state, caller = store_of(request), _state(request), caller_of(request)
    subject = erasure.Subject("session", key, tenant=caller.sees)
    done = await _run(erasure.erase, store, state, subject, caller.name)
    # A process's own copy of a stored response (served only while the store does not answer) stays in its
    # memory until newer ones push it out: it is in no file.
    done.pop("responses")
    if not done["removed"]:
        raise APIError(404, "No such session in the store (it may not be written yet, or was retired).",
                       param="key", code="session_not_found")
    return web.json_response({"object": "session.erased", **done}, dumps=dumps)


class ErasuresQuery(Query):
    limit: between(1, 10_000) = 100


async def list_erasures(request: web.Request) -> web.Response:
    limit = ErasuresQuery.of(request).limit
    found = await _run(erasure.erasures, _state(request), limit, sees(request))
    return web.json_response({"object": "list", "data": found}, dumps=dumps)
