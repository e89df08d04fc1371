"""Routes as data (api/route.py): every surface lists its routes once, each with the scope a key needs,
and one loop mounts them, the APIs an agent calls again under /r/{rollout}/. A route mounted without a
scope cannot be: these tests walk the app's own router, so a route added later is checked too."""

from __future__ import annotations

import http.client
import re

import pytest

from looptrace.proxy.api import anthropic, monitoring, native, openai, rollouts, viewer
from looptrace.proxy.api.app import create_app
from looptrace.proxy.api.clients import ROLLOUT_PREFIX
from looptrace.proxy.api.route import SCOPES, Route, Scope, mount
from looptrace.proxy.settings import Settings

from app_thread import AppThread

SURFACES = (monitoring, openai, anthropic, native, rollouts, viewer)
ALL = [route for surface in SURFACES for route in surface.ROUTES]


def settings(folder, **more) -> Settings:
    (folder / "none.jsonl").write_text('{"text": "unused"}\n')
    return Settings(model="unused", backend="replay", replay=str(folder / "none.jsonl"), served_model_name="tiny",
                    trace_db=str(folder / "traces.sqlite3"), **more)


def test_every_mounted_route_has_a_scope(tmp_path):
    app = create_app(settings(tmp_path))
    scopes = app[SCOPES]
    unscoped = [f"{r.method} {r.resource.canonical}" for r in app.router.routes() if r not in scopes]
    assert not unscoped, unscoped
    mounted = {(r.method, r.resource.canonical) for r in app.router.routes()}
    for route in ALL:
        path = re.sub(r"\{(\w+):[^}]+\}", r"{\1}", route.path)  # as aiohttp names it: /v1/sessions/{key}
        assert (route.method, path) in mounted, route
        # An API an agent calls is under /r/{rollout}/ too, with the same scope; nothing else is.
        assert ((route.method, ROLLOUT_PREFIX + path) in mounted) == route.rollout, route
    assert {r.path for r in ALL if r.rollout} >= {"/v1/chat/completions", "/v1/responses", "/v1/messages"}


def test_a_route_without_a_scope_is_refused_at_mount(tmp_path):
    app = create_app(settings(tmp_path))

    async def handler(request):  # pragma: no cover - never called
        raise AssertionError

    with pytest.raises(TypeError, match="without a scope"):
        mount(app, [Route("GET", "/v1/unscoped", handler, "infer")])  # a string is not a Scope


def _path(template: str) -> str:
    return re.sub(r"\{[^}]+\}", "x", template)


@pytest.fixture(scope="module")
def keyed(qwen3_5_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("routes")
    given = settings(folder, api_key="s3cret")
    given.model = str(qwen3_5_dir)
    running = AppThread(given).start()
    yield running
    running.stop()


@pytest.mark.parametrize("route", ALL, ids=lambda r: f"{r.method} {r.path}")
def test_the_key_is_asked_on_every_route_but_the_public_ones(keyed, route):
    for prefix in ("", _path(ROLLOUT_PREFIX)) if route.rollout else ("",):
        connection = http.client.HTTPConnection("127.0.0.1", int(keyed.url.rpartition(":")[2]), timeout=30)
        try:
            body = b"{}" if route.method == "POST" else None
            connection.request(route.method, prefix + _path(route.path), body=body,
                               headers={"Content-Type": "application/json"})
            status = connection.getresponse().status
        finally:
            connection.close()
        if route.scope is Scope.PUBLIC:
            assert status != 401, route
        else:
            assert status == 401, (route, prefix, status)
