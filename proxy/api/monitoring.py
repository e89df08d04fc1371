"""What operators poll: GET /health (is the model loaded, and how is it doing) and GET /metrics (Prometheus)."""

from __future__ import annotations

from aiohttp import web

from .keys import RUNTIME, TELEMETRY
from .route import Route, Scope


async def health(request: web.Request) -> web.Response:
    body = request.app[RUNTIME].health()
    return web.json_response(body, status=200 if body["status"] == "ready" else 503)


async def metrics(request: web.Request) -> web.Response:
    body, content_type = request.app[TELEMETRY].metrics.exposition(request.headers.get("Accept"))
    response = web.Response(body=body)
    response.headers["Content-Type"] = content_type
    return response


ROUTES = (Route("GET", "/health", health, Scope.PUBLIC), Route("GET", "/metrics", metrics, Scope.PUBLIC))
