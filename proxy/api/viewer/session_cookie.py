"""The viewer's session cookie: what the page's browser holds instead of the API key.

login.py opens a session when the page hands it a key once, and sets this cookie: an opaque random
token (never the key; the store keeps only its digest: trace_store/login_sessions.py), HttpOnly (the
page's scripts never read it), SameSite=Strict (no other site's page makes the browser send it),
Path=/, and Secure when the request came over https (`request.secure`: looptrace trusts no proxy's
`X-Forwarded-Proto`, there being no setting that says which proxy to trust).

The auth guard (auth.py) takes it as the key it stands for on looptrace's own routes (route.py's
`takes_cookie`), with that key's scopes and tenant, when a request carries no key of its own. A
session is read from the store at most once a CACHE_SECONDS per process, like a key, so a logout or a
revoked key ends it within a second on every worker.
"""

from __future__ import annotations

import asyncio
import hmac
import time

from aiohttp import web

from looptrace.trace_store.login_sessions import LIFETIME_S, LoginSessions

from ..auth import ADMIN, CACHE_SECONDS, Caller, Guard
from ..errors import APIError

COOKIE = "looptrace-session"  # not looptrace_…: that shape is a metric's (common/attributes.py)
ENDED = "This viewer login has ended (logged out, expired, or its key was changed): log in with the key again."
MAX_TOKEN = 128  # a token is 43 characters; a longer cookie is no session of ours, and is not looked up


class SessionCookies:
    """The sessions this process checks cookies against, and their cache."""

    def __init__(self, guard: Guard) -> None:
        self.guard = guard
        keys = guard.keys  # the store's key table: None where there is no store, and no session either
        self.sessions = LoginSessions(keys.state) if keys is not None else None
        self._found: dict[str, tuple[float, Caller | None, str | None]] = {}  # token → (when, caller, why refused)

    async def __call__(self, request: web.Request) -> tuple[Caller | None, str | None] | None:
        """The caller the request's cookie stands for, or (None, why not); None: it carries none."""
        token = request.cookies.get(COOKIE)
        if not token or self.sessions is None:
            return None
        if len(token) > MAX_TOKEN:
            return None, ENDED
        now = time.monotonic()
        found = self._found.get(token)
        if found is not None and now - found[0] < CACHE_SECONDS:
            return found[1], found[2]
        caller, refused = await self._store(self._caller, token)
        if len(self._found) > 4096:
            self._found.clear()  # a bound on what strangers' cookies can make this hold
        self._found[token] = (now, caller, refused)
        return caller, refused

    def _caller(self, token: str) -> tuple[Caller | None, str | None]:
        found = self.sessions.find(token)
        if found is None:
            return None, ENDED
        name, digest = found
        keys = self.guard.keys
        if name is None:  # opened with --api-key: still the operator's only while that key is the same
            api_key = self.guard.settings.api_key
            same = bool(api_key) and hmac.compare_digest(digest or "", keys.digest(api_key))
            return (ADMIN, None) if same else (None, ENDED)
        key = keys.find(name)
        if key is None:
            return None, ENDED
        if key.revoked_ns is not None:
            return None, f"The API key '{key.name}' was revoked."
        return Caller(key.name, key.tenant, frozenset(key.scopes), key.models, key.tokens_per_day,
                      key.requests_per_minute), None

    async def open(self, caller: Caller) -> tuple[str, int]:
        """A new session for `caller` (a key just checked): its token and when it expires (ns)."""
        if self.sessions is None:
            raise APIError(404, "The viewer's login keeps its sessions in the trace store, which is off "
                           "(--trace-db off).", code="trace_store_off")
        api_key = self.guard.settings.api_key
        if caller is ADMIN:
            return await self._store(self.sessions.open, None, self.guard.keys.digest(api_key))
        return await self._store(self.sessions.open, caller.name)

    async def close(self, token: str) -> bool:
        self._found.pop(token, None)
        if self.sessions is None or len(token) > MAX_TOKEN:
            return False
        return await self._store(self.sessions.close, token)

    async def _store(self, function, *args):
        """Off the event loop; a store that fails is a 503 that says why, as the keys' is (auth.py)."""
        try:
            return await asyncio.to_thread(function, *args)
        except Exception as exc:  # noqa: BLE001 - either driver's error, or StoreUnavailable: said, not a 500
            raise APIError(503, f"The viewer's login sessions cannot be read from the store at "
                           f"{self.sessions.state.where}: {str(exc).strip() or type(exc).__name__}",
                           type="server_error", code="key_store_unavailable") from exc


COOKIES: web.AppKey[SessionCookies] = web.AppKey("session_cookies", SessionCookies)


def set_cookie(response: web.StreamResponse, request: web.Request, token: str) -> None:
    response.set_cookie(COOKIE, token, max_age=LIFETIME_S, path="/", httponly=True, samesite="Strict",
                        secure=request.secure)


def clear_cookie(response: web.StreamResponse, request: web.Request) -> None:
    response.del_cookie(COOKIE, path="/", httponly=True, samesite="Strict", secure=request.secure)
