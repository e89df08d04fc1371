"""The trace viewer: its data (traces, sessions, the live feed, compare) and its pages. It only reads."""

from __future__ import annotations

from aiohttp import web

from . import pages
from .compare import compare_sessions
from .sessions import get_session, list_sessions, live
from .traces import get_prompt, get_tokens, get_trace, list_traces


def add_routes(app: web.Application) -> None:
    router = app.router
    router.add_get("/v1/traces", list_traces)
    router.add_get("/v1/traces/{trace_id}", get_trace)
    router.add_get("/v1/traces/{trace_id}/prompt", get_prompt)
    router.add_get("/v1/traces/{trace_id}/tokens", get_tokens)
    router.add_get("/v1/compare", compare_sessions)  # ?a=KEY&b=KEY: the compare page's data
    router.add_get("/v1/sessions", list_sessions)
    router.add_get("/v1/sessions/", get_session)  # ?key=: a key of "." or ".." (sessions.py)
    router.add_get("/v1/sessions/{key:.+}", get_session)
    router.add_get("/v1/live", live)
    pages.add_routes(router)
