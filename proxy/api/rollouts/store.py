"""What the rollout routes share: the rollouts' store, a rollout named in the path, and its steps as the
trace store holds them (a query of the store runs through ../stored.py, as every API's does; a step a
request names is read by protocol.py)."""

from __future__ import annotations

from aiohttp import web

from looptrace.trace_store.rollouts import MAX_INFO_BYTES, Rollouts, info_json

from ..clients import rollout_of
from ..errors import APIError, invalid
from ..keys import TELEMETRY
from ..auth import sees, tenant_of, within
from ..stored import on_store, read, store_of


def rollouts_of(request: web.Request) -> Rollouts:
    rollouts = request.app[TELEMETRY].rollouts
    if rollouts is None:
        raise APIError(404, "Rollouts are kept in the trace store, and it is off (--trace-db off).",
                       code="trace_store_off")
    return rollouts


def rollout_key(request: web.Request) -> str:
    """The rollout the path names, within the caller's tenant (as its requests were kept: serving.py)."""
    key, _ = rollout_of(request.match_info, {})
    return within(tenant_of(request), key)


def named(request: web.Request, key: str) -> str:
    """A rollout as the caller names it: its tenant's prefix taken off (the operator sees keys as kept)."""
    tenant = tenant_of(request)
    return key[len(tenant) + 1:] if tenant is not None and key.startswith(f"{tenant}/") else key


async def rollout_steps(request: web.Request, key: str) -> list[dict] | None:
    """The rollout's steps in the trace store, in order (its last ones written first: a trainer posts
    right after the last answer), or None when the store holds no such session."""
    await on_store(request.app[TELEMETRY].flush, 5)
    session = await read(store_of(request).session, None, key, 0, None, sees(request))
    return None if session is None else session["steps"]


def info_of(value: object, param: str) -> dict | None:
    """Free `info`: a JSON object, bounded."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid(f"Invalid type for '{param}': expected an object.", param=param, code="invalid_type")
    if len(info_json(value)) > MAX_INFO_BYTES:  # as stored
        raise invalid(f"'{param}' is larger than {MAX_INFO_BYTES} bytes as JSON.", param=param)
    return value
