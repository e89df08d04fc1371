"""GET /v1/models: the one model this server serves, as the OpenAI API lists models."""

from __future__ import annotations

import time

from aiohttp import web

from ..keys import RUNTIME


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
