"""GET /v1/models: the one model this server serves, as the OpenAI API lists models (none, to a key that
may not use it)."""

from __future__ import annotations

import time

from aiohttp import web

from ..auth import caller_of
from ..keys import RUNTIME


async def models(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    await runtime.ready()
    if not caller_of(request).may_use(runtime.model_name):
        return web.json_response({"object": "list", "data": []})
    return web.json_response({"object": "list", "data": [{
        "id": runtime.model_name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "looptrace",
        "max_model_len": runtime.max_model_len,
        "root": runtime.settings.model,
    }]})
