"""POST /v1/responses/{id}/cancel: stop a running response."""

from __future__ import annotations

from aiohttp import web

from ...auth import tenant_of
from ...errors import APIError, invalid
from .running import RUNNING
from .store import responses_of


async def cancel_response(request: web.Request) -> web.Response:
    response_id = request.match_info["response_id"]
    cancelled = request.app[RUNNING].cancel(response_id, tenant_of(request))
    if cancelled is not None:
        return web.json_response(cancelled)
    stored = await _stored(request, response_id)
    if stored is not None:
        raise invalid(f"Response '{response_id}' is {stored.get('status')}: only a running response can be "
                      "cancelled.", param="response_id", code="response_not_running")
    raise APIError(404, f"No response '{response_id}' is running in this process, nor stored. With --workers (or "
                   "several servers) a cancel must reach the process that runs the response: running generations "
                   "are not shared, stored responses are.", param="response_id", code="response_not_found")


async def _stored(request: web.Request, response_id: str) -> dict | None:
    try:
        return await responses_of(request).response(response_id)
    except APIError as err:
        if err.status == 404:
            return None
        raise
