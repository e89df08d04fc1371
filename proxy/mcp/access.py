"""Who may read over streamable HTTP: the keys of the trace store (trace_store/api_keys.py), as the HTTP
API checks them (proxy/api/auth.py), through the MCP SDK's own bearer-token check.

A request carries `Authorization: Bearer KEY`; the SDK answers 401 without a key it takes and 403
without the `traces:read` scope (an admin key has every scope). The key's tenant is what its calls
read (an admin key: every tenant's), carried in the access token's claims to each tool call.

Unlike the HTTP API, a store with no keys is not served open over HTTP: the command refuses to start
(server.py), so that no key ever made cannot mean every trace on the network.
"""

from __future__ import annotations

import asyncio

from mcp.server.auth.provider import AccessToken

from looptrace.trace_store.api_keys import KeyStore

READ = "traces:read"
ADMIN = "admin"
TENANT = "looptrace-tenant"  # the claim the tenant is carried in (None: every tenant's records)


class StoreKeys:
    """The SDK's TokenVerifier over the store's keys; each request's key is looked up (off the event
    loop), so a revoked key is refused at its next request."""

    def __init__(self, keys: KeyStore) -> None:
        self.keys = keys

    async def verify_token(self, token: str) -> AccessToken | None:
        key = await asyncio.to_thread(self.keys.lookup, token.strip())
        if key is None or key.revoked_ns is not None:
            return None
        scopes = list(key.scopes)
        if ADMIN in scopes and READ not in scopes:
            scopes.append(READ)
        return AccessToken(token=token, client_id=key.name, scopes=scopes,
                           claims={TENANT: None if ADMIN in key.scopes else key.tenant})


def tenant_of(token: AccessToken | None, default: str | None) -> str | None:
    """The tenant a call reads as: its key's over HTTP, else `default` (stdio: --tenant, or the operator)."""
    if token is None or not token.claims or TENANT not in token.claims:
        return default
    return token.claims[TENANT]
