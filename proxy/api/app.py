"""The aiohttp application: its routes, its middleware (security headers, errors, Host names, requests
from other sites, keys) and the model's lifetime."""

from __future__ import annotations

import asyncio

from aiohttp import web

from ..engine.memory import Memory, StoredMemory
from ..engine.runtime import Runtime
from ..observe.telemetry import Telemetry
from ..settings import Settings
from . import anthropic, gemini, monitoring, native, openai, rollouts, viewer
from .auth import GUARD, Guard, authenticate
from .budgets import BUDGETS, Budgets
from .cache_salts import CacheSalts
from .cross_site import refuse_cross_site
from .errors import error_middleware
from .hosts import host_check
from .history_sessions import HistorySessions
from .keys import CACHE_SALTS, HISTORY_SESSIONS, MEMORY, RUNTIME, SETTINGS, TELEMETRY
from .route import mount
from .unreadable import answer_unreadable_requests
from .viewer import pages

_WATCH: web.AppKey[asyncio.Task] = web.AppKey("watch", asyncio.Task)


# aiohttp refuses a header line past 8 KiB, below the API (a plain-text 400 it writes itself); some
# clients send long cookies or tokens. Past these, aiohttp refuses the request (answered in the API's
# error shape: unreadable.py).
HTTP_LIMITS = {"max_line_size": 64 * 1024, "max_field_size": 64 * 1024}


def create_app(settings: Settings, runtime: Runtime | None = None) -> web.Application:
    app = web.Application(middlewares=[pages.security_headers, error_middleware, host_check(settings.allowed_hosts),
                                       refuse_cross_site, authenticate],
                          client_max_size=256 * 1024**2, handler_args=HTTP_LIMITS)
    answer_unreadable_requests(app)  # a request aiohttp cannot read still gets the API's error shape
    app[SETTINGS] = settings
    app[RUNTIME] = runtime or Runtime(settings)
    app[TELEMETRY] = Telemetry(settings)
    # With a store, what each conversation's model read and sampled lives in it: any process serves any
    # turn (the Responses API's stored responses too: openai/routes.py).
    state = app[TELEMETRY].state
    app[MEMORY] = StoredMemory(state) if state is not None else Memory()
    app[CACHE_SALTS] = CacheSalts()  # what keeps one tenant's cached prefixes from another (cache_salts.py)
    app[HISTORY_SESSIONS] = HistorySessions()  # the session a request that names none continues
    app[GUARD] = Guard(settings, state)  # --api-key, and the keys kept in the store (auth.py)
    app[BUDGETS] = Budgets(state, app[TELEMETRY].metrics)  # each key's budgets, counted in the store
    mount(app, monitoring.ROUTES)
    # The API surfaces, siblings: each sets up what its routes share (stores, an error shape of its own
    # if its clients expect one) and lists its routes; looptrace's own routes that run token ids;
    # rollouts (agent RL: rewards, trainer logprobs); the trace viewer, which only reads.
    for surface in (openai, anthropic, gemini, native, rollouts, viewer):
        surface.setup(app)
        mount(app, surface.ROUTES)
    app.on_startup.append(_start)
    app.on_cleanup.append(_stop)
    return app


async def _start(app: web.Application) -> None:
    runtime = app[RUNTIME]
    runtime.start()
    app[TELEMETRY].feed.attach(asyncio.get_running_loop())

    async def watch_when_loaded() -> None:
        # The model's name is final only once loaded (a vLLM server may name it).
        await runtime.loaded()
        if runtime.status == "ready":
            app[TELEMETRY].metrics.watch(runtime.model_name, lambda: runtime.backend.running,
                                         lambda: runtime.backend.waiting)
            if runtime.backend.upstreams:
                app[TELEMETRY].metrics.watch_upstreams(runtime.model_name, runtime.backend.upstreams)

    app[_WATCH] = asyncio.create_task(watch_when_loaded())


async def _stop(app: web.Application) -> None:
    await app[RUNTIME].close()
    app[MEMORY].close()
    app[TELEMETRY].close()
