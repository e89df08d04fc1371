"""GET /v1beta/models and /v1beta/models/{model}: the one model this server serves, as the Gemini API
describes a model (none, to a key that may not use it). Any name finds it, as any name in a
generating path is served by it (generate.py)."""

from __future__ import annotations

from aiohttp import web

from ..auth import caller_of
from ..errors import model_not_found
from ..keys import RUNTIME

METHODS = ["generateContent", "streamGenerateContent", "countTokens"]


def _model(runtime) -> dict:
    name = runtime.model_name
    return {"name": f"models/{name}", "baseModelId": name, "version": "looptrace", "displayName": name,
            "description": f"{runtime.settings.model}, served by looptrace", "inputTokenLimit": runtime.max_model_len,
            "outputTokenLimit": runtime.max_model_len, "supportedGenerationMethods": METHODS, "thinking": True}


async def list_models(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    await runtime.ready()
    if not caller_of(request).may_use(runtime.model_name):
        return web.json_response({"models": []})
    return web.json_response({"models": [_model(runtime)]})


async def get_model(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    await runtime.ready()
    if not caller_of(request).may_use(runtime.model_name):
        raise model_not_found(request.match_info["model"][:256], None)
    return web.json_response(_model(runtime))
