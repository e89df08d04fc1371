"""The trace viewer: its data (traces, sessions, the live feed, compare) and its pages; and erasing a session."""

from __future__ import annotations

from aiohttp import web

from ..route import Route, Scope, mount_static
from . import pages
from .compare import compare_sessions
from .erasure import erase_session, list_erasures
from .login import login, logout, setup as setup_login
from .sessions import get_session, list_sessions, live
from .traces import get_prompt, get_tokens, get_trace, list_traces

READ = Scope.TRACES_READ
ROUTES = (
    Route("GET", "/v1/traces", list_traces, READ),
    Route("GET", "/v1/traces/{trace_id}", get_trace, READ),
    Route("GET", "/v1/traces/{trace_id}/prompt", get_prompt, READ),
    Route("GET", "/v1/traces/{trace_id}/tokens", get_tokens, READ),
    Route("GET", "/v1/compare", compare_sessions, READ),  # ?a=KEY&b=KEY: the compare page's data
    Route("GET", "/v1/sessions", list_sessions, READ),
    Route("GET", "/v1/sessions/", get_session, READ),  # ?key=: a key of "." or ".." (sessions.py)
    Route("GET", "/v1/sessions/{key:.+}", get_session, READ),
    Route("GET", "/v1/live", live, READ),
    # A tenant's own sessions and erasures (erasure.py); every tenant's for the operator.
    Route("DELETE", "/v1/sessions/", erase_session, Scope.ERASE),  # ?key=
    Route("DELETE", "/v1/sessions/{key:.+}", erase_session, Scope.ERASE),
    Route("GET", "/v1/erasures", list_erasures, Scope.ERASE),
    Route("POST", "/v1/login", login, Scope.PUBLIC),  # the page's key, checked; a session cookie (login.py)
    Route("POST", "/v1/logout", logout, Scope.PUBLIC),
    *(Route("GET", path, pages.page, Scope.PUBLIC) for path in pages.PAGES),
    *(Route("GET", path, pages.compare_page, Scope.PUBLIC) for path in pages.COMPARE_PAGES),
)


def setup(app: web.Application) -> None:
    mount_static(app, "/static", pages.STATIC, Scope.PUBLIC)
    setup_login(app)
