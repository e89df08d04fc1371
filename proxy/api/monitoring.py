"""What operators and clients poll: GET /health, GET /v1/models, GET /metrics."""

from __future__ import annotations

import time

from aiohttp import web

from .keys import RUNTIME, TELEMETRY


async def health(request: web.Request) -> web.Response:
    body = request.app[RUNTIME].health()
    return web.json_response(body, status=200 if body["status"] == "ready" else 503)


async def models(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    await runtime.ready()
    return web.json_response({"object": "list", "data": [{
        "id": runtime.model_name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "looptrace",
        "max_model_len": runtime.max_model_len,
        "root": runtime.settings.model,
    }]})


async def metrics(request: web.Request) -> web.Response:
    body, content_type = request.app[TELEMETRY].metrics.exposition(request.headers.get("Accept"))
    response = web.Response(body=body)
    response.headers["Content-Type"] = content_type
    return response
