"""The aiohttp application: routes, authentication, and the model's lifetime."""

from __future__ import annotations

import asyncio
import hmac
import time

from aiohttp import web

from .chat import chat_completions
from .errors import APIError, error_middleware
from .keys import RUNTIME, SETTINGS, TELEMETRY
from .response_store import RESPONSE_STORE, ResponseStore
from .responses import create_response, delete_response, get_response
from .runtime import Runtime
from .settings import Settings
from .telemetry import Telemetry
from .traces_api import get_trace, list_traces, metrics

PUBLIC_PATHS = ("/health", "/metrics")
_WATCH: web.AppKey[asyncio.Task] = web.AppKey("watch")


def create_app(settings: Settings, runtime: Runtime | None = None) -> web.Application:
    app = web.Application(middlewares=[error_middleware, _auth_middleware], client_max_size=256 * 1024**2)
    app[SETTINGS] = settings
    app[RUNTIME] = runtime or Runtime(settings)
    app[TELEMETRY] = Telemetry(settings)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/traces", list_traces)
    app.router.add_get("/v1/traces/{trace_id}", get_trace)
    app[RESPONSE_STORE] = ResponseStore()
    app.router.add_post("/v1/responses", create_response)
    app.router.add_get("/v1/responses/{response_id}", get_response)
    app.router.add_delete("/v1/responses/{response_id}", delete_response)
    app.on_startup.append(_start)
    app.on_cleanup.append(_stop)
    return app


async def _start(app: web.Application) -> None:
    runtime = app[RUNTIME]
    runtime.start()

    async def watch_when_loaded() -> None:
        # The model's name is final only once loaded (a vLLM server may name it).
        await runtime.loaded()
        if runtime.status == "ready":
            app[TELEMETRY].metrics.watch(runtime.model_name, lambda: runtime.backend.running,
                                         lambda: runtime.backend.waiting)

    app[_WATCH] = asyncio.create_task(watch_when_loaded())


async def _stop(app: web.Application) -> None:
    await app[RUNTIME].close()
    app[TELEMETRY].close()


@web.middleware
async def _auth_middleware(request: web.Request, handler):
    key = request.app[SETTINGS].api_key
    if key and request.path not in PUBLIC_PATHS:
        given = request.headers.get("Authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
            raise APIError(
                401, "Incorrect API key provided: send it as 'Authorization: Bearer KEY'." if given
                else "No API key provided: send it as 'Authorization: Bearer KEY'.", code="invalid_api_key",
            )
    return await handler(request)


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
