"""The viewer's login sessions: what a browser holds instead of an API key (proxy/api/viewer/login.py).

A session is an opaque random token (256 bits) given to the browser as a cookie; the store keeps only
its SHA-256 digest (a random token needs no keyed hash: its digest cannot be guessed back), the name
of the key it was opened with (a key's name is never reused: api_keys.py) or, for --api-key, that
key's keyed digest (never the key: a changed --api-key ends its sessions), and when it expires. It
lives in the state every worker shares, beside the keys, so a session opened on one worker is known
on all of them, and it ends with its key: the key is read again with it, and a revoked one refused.
"""

from __future__ import annotations

import hashlib
import secrets
import time

from .state import StateStore

LIFETIME_S = 12 * 3600  # a working day: then the page asks for the key again
MAX_SESSIONS = 10_000  # the newest kept; past it the oldest end (a bound on what logins can make it hold)

TABLE = """CREATE TABLE IF NOT EXISTS login_sessions (digest TEXT PRIMARY KEY, key_name TEXT, key_digest TEXT,
                                               created_ns BIGINT NOT NULL, expires_ns BIGINT NOT NULL)"""
PRUNE = """DELETE FROM login_sessions WHERE expires_ns <= ? OR digest IN (
    SELECT digest FROM login_sessions ORDER BY created_ns DESC LIMIT {all} OFFSET ?)"""


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


class LoginSessions:
    """The login_sessions table, over a StateStore's connection (SQLite or PostgreSQL)."""

    def __init__(self, state: StateStore) -> None:
        self.state = state
        self._made = False

    def _table(self) -> None:
        # Made here, on first use, by the one module that reads it; the same statement on both stores.
        if not self._made:
            try:
                self.state._write([(TABLE, ())])
            except Exception:  # noqa: BLE001 - two PostgreSQL workers making it at once: one wins
                self.state._read([("SELECT 1 FROM login_sessions LIMIT 1", ())])
            self._made = True

    def open(self, key_name: str | None, key_digest: str | None = None,
             lifetime_s: float = LIFETIME_S) -> tuple[str, int]:
        """A new session for the key called `key_name` (None: --api-key, whose digest is `key_digest`): its
        token (given once, kept nowhere) and when it expires (ns since the epoch)."""
        self._table()
        token = secrets.token_urlsafe(32)
        now = time.time_ns()
        expires = now + int(lifetime_s * 1e9)
        self.state._write([("INSERT INTO login_sessions VALUES (?, ?, ?, ?, ?)",
                            (digest(token), key_name, key_digest, now, expires)),
                           (PRUNE.format(all=self.state.ALL), (now, MAX_SESSIONS))])
        return token, expires

    def find(self, token: str) -> tuple[str | None, str | None] | None:
        """(key name, key digest) of the live session `token` names, as `open` was given them; None: no
        such session, or it expired or was closed."""
        self._table()
        (rows,) = self.state._read([("SELECT key_name, key_digest FROM login_sessions WHERE digest = ? AND "
                                     "expires_ns > ?", (digest(token), time.time_ns()))])
        return (rows[0][0], rows[0][1]) if rows else None

    def close(self, token: str) -> bool:
        """The session ended (logged out): refused from now on, by every worker within its cache's time."""
        self._table()
        return self.state._write([("DELETE FROM login_sessions WHERE digest = ?", (digest(token),))])[0] > 0
