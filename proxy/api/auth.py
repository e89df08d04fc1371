"""Who is calling, and what they may do: the key a request carries, checked against the scope its route
needs (route.py), and the caller it makes (a key's name, tenant, scopes and models) for the handlers.

- No key was ever made (`looptrace keys create`) and no --api-key: the server is open, as it always was;
  every caller is the operator (no tenant: every record readable).
- --api-key: one admin key, as before.
- Keys in the store: each request carries one (`Authorization: Bearer KEY` or `x-api-key: KEY`), is
  refused (401) without a valid one, and (403) where its key lacks the route's scope. A key's tenant
  (its name, unless given) is what it sees: its own records and its tenant's, nothing else.

A key's record is read from the store at most once a CACHE_SECONDS per process, so a revoked key is
refused within that time on every worker; the read runs off the event loop.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from dataclasses import dataclass

from aiohttp import web

from looptrace.trace_store.api_keys import SCOPES, KeySecretMismatch, KeyStore, server_secret

from .errors import APIError
from .route import Scope, scope_of, takes_cookie

log = logging.getLogger("looptrace")

CACHE_SECONDS = 0.5  # a revoked key is refused within a second, on every worker


@dataclass(frozen=True, slots=True)
class Caller:
    name: str  # the key's name ("admin": --api-key; "open": no key needed)
    tenant: str | None  # None: the operator, who sees every tenant's records
    scopes: frozenset[str]
    models: tuple[str, ...] | None = None  # None: every model
    tokens_per_day: int | None = None
    requests_per_minute: int | None = None

    def may(self, scope: Scope) -> bool:
        return scope is Scope.PUBLIC or Scope.ADMIN.value in self.scopes or scope.value in self.scopes

    def may_use(self, model: str) -> bool:
        return self.models is None or model in self.models

    @property
    def sees(self) -> str | None:
        """The tenant whose records it reads; None: every tenant's (the operator, an admin key)."""
        return None if Scope.ADMIN.value in self.scopes else self.tenant


OPEN = Caller("open", None, frozenset(SCOPES))
ADMIN = Caller("admin", None, frozenset(SCOPES))
CALLER: web.RequestKey[Caller] = web.RequestKey("caller", Caller)  # who sent the request


def caller_of(request: web.Request) -> Caller:
    return request.get(CALLER, OPEN)


def tenant_of(request: web.Request) -> str | None:
    """The tenant the request's records are written for (None: the operator's, readable by admins)."""
    return caller_of(request).tenant


def sees(request: web.Request) -> str | None:
    """The tenant whose records the request may read (None: all of them)."""
    return caller_of(request).sees


def within(tenant: str | None, key: str | None) -> str | None:
    """A client's name for something (a conversation, a rollout, a response id) as kept for `tenant`:
    prefixed by it, so that another tenant's thing of the same name is another thing. The operator's
    (tenant None) are kept as named."""
    return key if tenant is None or key is None else f"{tenant}/{key}"


class Guard:
    """The keys this process checks requests against: --api-key, and the store's."""

    def __init__(self, settings, state) -> None:
        self.settings = settings  # its api_key read at each request: the one admin key
        self.keys: KeyStore | None = None
        if state is not None:
            try:
                self.keys = KeyStore(state, server_secret())
            except KeySecretMismatch:
                raise
            except Exception as exc:  # noqa: BLE001 - a store that fails is reported, and its keys are not read
                log.warning("API keys could not be read from the store at %s: %s", state.where, exc)
        self._found: dict[str, tuple[float, Caller | None, str | None]] = {}  # key → (when, caller, why refused)
        self._any: tuple[float, bool] = (0.0, False)
        self._used: dict[str, float] = {}
        self.cookie = None  # the viewer's login sets it: its session cookie → (caller, why refused) | None

    async def resolve(self, token: str) -> tuple[Caller | None, str | None]:
        """The caller a key makes, or (None, why it is refused): the viewer's login checks a key so too."""
        return await self._resolve(token)

    async def caller(self, request: web.Request) -> Caller:
        scope = scope_of(request)
        if scope is Scope.PUBLIC:
            return OPEN
        if not self.settings.api_key and not await self._keys_made():
            return OPEN
        given = request.headers.get("Authorization", "")
        kind, _, token = given.partition(" ")
        token = token.strip() if kind.lower() == "bearer" else None
        if token is None and "x-api-key" in request.headers:
            token = given = request.headers["x-api-key"].strip()
        if token is None and (google := request.headers.get("x-goog-api-key") or request.query.get("key")):
            token = given = google.strip()  # the Gemini API's: a header, or `?key=` (google-genai, Gemini CLI)
        how = "send it as 'Authorization: Bearer KEY', 'x-api-key: KEY' or 'x-goog-api-key: KEY'"
        # Where no key was sent, the viewer's session cookie stands for one (viewer/session_cookie.py).
        session = await self.cookie(request) if token is None and self.cookie and takes_cookie(request) else None
        if token is None and session is None:
            raise APIError(401, f"Incorrect API key provided: {how}." if given else f"No API key provided: {how}.",
                           code="invalid_api_key")
        caller, refused = session or await self._resolve(token)
        if caller is None:
            raise APIError(401, refused or f"Incorrect API key provided: {how}.", code="invalid_api_key")
        if scope is not None and not caller.may(scope):
            raise APIError(403, f"This API key ({caller.name}) may not do this: the route needs the "
                           f"'{scope.value}' scope, and the key has {', '.join(sorted(caller.scopes))}.",
                           type="permission_error", code="missing_scope")
        return caller

    async def _keys_made(self) -> bool:
        if self.keys is None:
            return False
        when, made = self._any
        if made or time.monotonic() - when < CACHE_SECONDS:
            return made  # once a key exists the server stays closed: revoking every key does not open it
        try:
            made = await asyncio.to_thread(self.keys.any)
        except Exception as exc:  # noqa: BLE001 - the store failing never breaks serving
            # As it was last known: a server that had keys stays closed (above); one that had none stays
            # open, and says so. Serve with --api-key too where an outage must not open the door.
            log.warning("API keys could not be read from the store at %s (%s): serving as before, with no "
                        "keys", self.keys.state.where, exc)
            made = False
        self._any = (time.monotonic(), made)
        return made

    async def _resolve(self, token: str) -> tuple[Caller | None, str | None]:
        api_key = self.settings.api_key
        if api_key and hmac.compare_digest(token.encode(errors="surrogateescape"), api_key.encode()):
            return ADMIN, None
        if self.keys is None:
            return None, None
        now = time.monotonic()
        found = self._found.get(token)
        if found is not None and now - found[0] < CACHE_SECONDS:
            return found[1], found[2]
        try:
            key = await asyncio.to_thread(self.keys.lookup, token)
        except Exception as exc:  # noqa: BLE001 - said to the caller: the store holding the keys fails
            raise APIError(503, f"The API keys cannot be read from the store at {self.keys.state.where}: "
                           f"{str(exc).strip() or 'no reason given'}", type="server_error",
                           code="key_store_unavailable") from exc
        if key is None:
            caller, refused = None, None
        elif key.revoked_ns is not None:
            caller, refused = None, f"The API key '{key.name}' was revoked."
        else:
            caller, refused = Caller(key.name, key.tenant, frozenset(key.scopes), key.models, key.tokens_per_day,
                                     key.requests_per_minute), None
            self._note_use(key.name, now)
        if len(self._found) > 4096:
            self._found.clear()  # a bound on what strangers' guesses can make this hold
        self._found[token] = (now, caller, refused)
        return caller, refused

    def _note_use(self, name: str, now: float) -> None:
        if now - self._used.get(name, -1e9) < 60:
            return
        self._used[name] = now
        keys = self.keys

        def write() -> None:
            try:
                keys.used(name)
            except Exception as exc:  # noqa: BLE001 - a last-use time is not worth a failed request
                log.debug("the last use of key %s was not written: %s", name, exc)

        asyncio.get_running_loop().run_in_executor(None, write)


GUARD: web.AppKey[Guard] = web.AppKey("guard", Guard)


@web.middleware
async def authenticate(request: web.Request, handler):
    request[CALLER] = await request.app[GUARD].caller(request)
    return await handler(request)
