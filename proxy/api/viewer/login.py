"""POST /v1/login and POST /v1/logout: the viewer's page hands the server a key once and holds a session
cookie instead (session_cookie.py), so the key is kept in no page storage a script could read.

The key is checked as every request's is (auth.py: --api-key or the store's keys, revoked ones
refused): a wrong one is a 401 and sets no cookie; one without `traces:read` is a 403 (the viewer only
reads what was recorded). Both routes are public (there is no key yet, or none needed to end a
session), and cross_site.py refuses either from another site's page.
"""

from __future__ import annotations

from aiohttp import web
from pydantic import Field

from looptrace.common.jsonio import dumps

from ..auth import GUARD
from ..errors import APIError
from ..protocol import Protocol, parse
from ..route import Scope
from ..validation import json_body
from .session_cookie import COOKIE, COOKIES, SessionCookies, clear_cookie, set_cookie

NO_STORE = {"Cache-Control": "no-store"}


class LoginRequest(Protocol):
    key: str = Field(min_length=1, max_length=4096)


async def login(request: web.Request) -> web.Response:
    body = parse(LoginRequest, await json_body(request))
    caller, refused = await request.app[GUARD].resolve(body.key.strip())
    if caller is None:
        raise APIError(401, refused or "Incorrect API key provided.", param="key", code="invalid_api_key")
    if not caller.may(Scope.TRACES_READ):
        raise APIError(403, f"This API key ({caller.name}) may not read traces: the viewer needs the "
                       f"'{Scope.TRACES_READ.value}' scope.", type="permission_error", code="missing_scope")
    token, expires_ns = await request.app[COOKIES].open(caller)
    response = web.json_response({"object": "login", "name": caller.name, "tenant": caller.tenant,
                                  "scopes": sorted(caller.scopes), "expires_at": expires_ns // 10**9},
                                 dumps=dumps, headers=NO_STORE)
    set_cookie(response, request, token)
    return response


async def logout(request: web.Request) -> web.Response:
    token = request.cookies.get(COOKIE)
    ended = bool(token) and await request.app[COOKIES].close(token)
    response = web.json_response({"object": "logout", "ended": ended}, dumps=dumps, headers=NO_STORE)
    clear_cookie(response, request)
    return response


def setup(app: web.Application) -> None:
    guard = app[GUARD]
    app[COOKIES] = guard.cookie = SessionCookies(guard)  # the guard reads the cookie through it (auth.py)
