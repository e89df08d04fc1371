"""API keys, kept in the trace store's state (so every worker and every host sharing the store agrees),
each only as a keyed hash: HMAC-SHA256 under a server secret that is not in the store.

The secret is server_secret.py's (LOOPTRACE_KEY_SECRET, else this machine's file). The store keeps a
check value of the secret it was first used with, so a host with another secret is told so instead of
refusing every key.

A key is `lt-` and 43 characters of URL-safe base64 (256 random bits). It is shown once, when made; a
lookup is by its digest (a keyed hash an attacker cannot aim at, so the index's timing tells nothing),
then compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass

from .server_secret import SECRET_ENV, server_secret
from .state import StateStore

# server_secret is read from here too: where it was defined before sealing (sealing.py) needed it below the state.
__all__ = ["DEFAULT_SCOPES", "NAME", "PREFIX", "SCOPES", "SECRET_ENV", "USED_EVERY_NS", "ApiKey", "KeySecretMismatch",
           "KeyStore", "server_secret"]

PREFIX = "lt-"
SCOPES = ("infer", "traces:read", "erase", "export", "admin")
DEFAULT_SCOPES = ("infer", "traces:read")
NAME = re.compile(r"[A-Za-z0-9_.@-]{1,64}")  # a key's and a tenant's name: shown, logged, a metric label
_CHECK = "api_key_secret_check"
USED_EVERY_NS = 60 * 10**9  # a key's last use is written at most this often


class KeySecretMismatch(RuntimeError):
    """This host's key secret is not the one the store's keys were made with."""


@dataclass(frozen=True, slots=True)
class ApiKey:
    name: str
    tenant: str
    scopes: tuple[str, ...]
    models: tuple[str, ...] | None = None  # None: every model
    tokens_per_day: int | None = None
    requests_per_minute: int | None = None
    created_ns: int = 0
    revoked_ns: int | None = None
    last_used_ns: int | None = None

    def listed(self) -> dict:
        """As `looptrace keys list` shows it: never a secret."""
        return {"name": self.name, "tenant": self.tenant, "scopes": list(self.scopes),
                "models": list(self.models) if self.models is not None else None,
                "tokens_per_day": self.tokens_per_day, "requests_per_minute": self.requests_per_minute,
                "created_ns": self.created_ns, "revoked_ns": self.revoked_ns, "last_used_ns": self.last_used_ns}


class KeyStore:
    """The keys table, over a StateStore's connection (SQLite or PostgreSQL)."""

    def __init__(self, state: StateStore, secret: bytes) -> None:
        self.state, self._secret = state, secret
        check = hmac.new(secret, b"looptrace api keys", hashlib.sha256).digest()
        if state.secret(_CHECK, check) != check:
            raise KeySecretMismatch(
                f"The API keys in the store at {state.where} were made with another key secret than this host's: "
                f"set {SECRET_ENV} to the secret of the host that made them (every host serving one store needs the "
                "same).")

    def digest(self, key: str) -> str:
        return hmac.new(self._secret, key.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()

    def create(self, name: str, *, tenant: str | None = None, scopes: tuple[str, ...] = DEFAULT_SCOPES,
               models: tuple[str, ...] | None = None, tokens_per_day: int | None = None,
               requests_per_minute: int | None = None) -> str:
        """A new key called `name`: the key itself, returned once and kept nowhere."""
        for what, value in (("key name", name), ("tenant", tenant or name)):
            if not NAME.fullmatch(value):
                raise ValueError(f"A {what} is 1 to 64 letters, digits and '_', '.', '@', '-': {value!r} is not.")
        unknown = [s for s in scopes if s not in SCOPES]
        if unknown or not scopes:
            raise ValueError(f"Scopes are {', '.join(SCOPES)}; not {', '.join(unknown) or 'none'}.")
        key = PREFIX + secrets.token_urlsafe(32)
        try:
            self.state._write([("INSERT INTO api_keys (name, tenant, scopes, models, tokens_per_day, requests_per_minute, "
                                "digest, created_ns) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                                (name, tenant or name, ",".join(scopes), ",".join(models) if models else None,
                                 tokens_per_day, requests_per_minute, self.digest(key), time.time_ns()))])
        except Exception as exc:  # noqa: BLE001 - the one refusal a client causes: the name is taken
            if self.find(name) is not None:
                raise ValueError(f"A key called {name!r} exists: choose another name (a revoked key keeps its name).") from exc
            raise
        return key

    def find(self, name: str) -> ApiKey | None:
        (rows,) = self.state._read([(f"SELECT {_COLUMNS} FROM api_keys WHERE name = ?", (name,))])
        return _key(rows[0]) if rows else None

    def listed(self) -> list[ApiKey]:
        (rows,) = self.state._read([(f"SELECT {_COLUMNS} FROM api_keys ORDER BY name", ())])
        return [_key(row) for row in rows]

    def revoke(self, name: str) -> bool:
        """The key refused from now on (by every process within CACHE_SECONDS); kept, to be listed."""
        return self.state._write([("UPDATE api_keys SET revoked_ns = ? WHERE name = ? AND revoked_ns IS NULL",
                                   (time.time_ns(), name))])[0] > 0

    def lookup(self, key: str) -> ApiKey | None:
        """The key's record (revoked ones too: the caller says why it refuses), or None."""
        digest = self.digest(key)
        (rows,) = self.state._read([(f"SELECT {_COLUMNS}, digest FROM api_keys WHERE digest = ?", (digest,))])
        if not rows or not hmac.compare_digest(rows[0][-1], digest):
            return None
        return _key(rows[0][:-1])

    def any(self) -> bool:
        """Whether any key was ever made: a server with none is open (or guarded by --api-key alone)."""
        (rows,) = self.state._read([("SELECT 1 FROM api_keys LIMIT 1", ())])
        return bool(rows)

    def used(self, name: str) -> None:
        self.state._write([("UPDATE api_keys SET last_used_ns = ? WHERE name = ?", (time.time_ns(), name))])


_COLUMNS = "name, tenant, scopes, models, tokens_per_day, requests_per_minute, created_ns, revoked_ns, last_used_ns"


def _key(row) -> ApiKey:
    name, tenant, scopes, models, per_day, per_minute, created, revoked, used = row
    return ApiKey(name, tenant, tuple(scopes.split(",")), tuple(models.split(",")) if models else None, per_day,
                  per_minute, created, revoked, used)
