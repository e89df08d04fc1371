"""The salt a tenant's requests carry into every prefix cache: vLLM's `cache_salt` (which it mixes into
the hash of a prompt's first block, so another salt's blocks are never found), the local backends'
kept states and the render cache (each keyed by it too). Without it a tenant could tell, by the time
to the first token or by the cache hits a trace reports, whether another tenant sent a prompt.

A salt is HMAC-SHA256 of the tenant's name under a key derived from the server's secret (the one API
keys are hashed under, outside the store: trace_store/api_keys.py), as 43 base64url characters (256
bits, the length vLLM's documentation asks for). So it is the same on every process and host sharing
that secret (a tenant's turns still hit vLLM's cache whichever worker relays them), and neither names
the tenant to whoever reads vLLM's requests or logs nor can be recomputed from a guessed name.
A request with no tenant (an open server, the operator's `--api-key`) carries none, as before.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Callable

from looptrace.trace_store.api_keys import server_secret

PURPOSE = b"looptrace prefix cache salts"  # so a salt is never another use's HMAC of the same name


def salt_for(key: bytes, tenant: str) -> str:
    """The salt of `tenant`'s requests under `key` (CacheSalts' key, derived from the server's secret)."""
    digest = hmac.new(key, tenant.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


class CacheSalts:
    """Each tenant's salt. The secret is read on the first tenant's request: a server without keys
    never needs it."""

    def __init__(self, secret: Callable[[], bytes] = server_secret) -> None:
        self._secret = secret
        self._key: bytes | None = None

    def of(self, tenant: str | None) -> str | None:
        if tenant is None:
            return None
        if self._key is None:
            self._key = hmac.new(self._secret(), PURPOSE, hashlib.sha256).digest()
        return salt_for(self._key, tenant)
