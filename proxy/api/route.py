"""A route as data: its method, path, handler and the scope a key needs to call it.

Each surface lists its routes once (its ROUTES) and sets up the stores they share (its `setup`);
`mount` adds them to the app, those an agent calls in a rollout again under /r/{rollout}/, and keeps
each one's scope where the auth middleware reads it. A route cannot be mounted without a scope.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum

from aiohttp import web

from .clients import ROLLOUT_PREFIX

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Scope(StrEnum):
    """What a key may be allowed; a route needs one."""

    PUBLIC = "public"  # no key: probes, Prometheus, the viewer's page and assets (they hold no data)
    INFER = "infer"  # run the model: the APIs agents call, fork, score, generate, rewards
    TRACES_READ = "traces:read"  # read what was recorded: traces, sessions, compare, the live feed
    ERASE = "erase"  # erase the tenant's own sessions and read its erasures (never granted by default)
    EXPORT = "export"  # take recorded data away whole (looptrace export)
    ADMIN = "admin"  # everything, every tenant's data


@dataclass(frozen=True, slots=True)
class Route:
    method: str
    path: str
    handler: Handler
    scope: Scope
    rollout: bool = False  # also at /r/{rollout}{path}: an API a rollout's agent calls with its base URL


SCOPES: web.AppKey[dict] = web.AppKey("route_scopes", dict)  # aiohttp route -> Scope
AGENT_APIS: web.AppKey[set] = web.AppKey("agent_apis", set)  # aiohttp routes of the APIs agents call (rollout)


def mount(app: web.Application, routes: Iterable[Route]) -> None:
    scopes = app.setdefault(SCOPES, {})
    for route in routes:
        if not isinstance(route.scope, Scope):
            raise TypeError(f"{route.method} {route.path} is mounted without a scope")
        for prefix in ("", ROLLOUT_PREFIX) if route.rollout else ("",):
            added = [app.router.add_route(route.method, prefix + route.path, route.handler)]
            if route.method == "GET":  # aiohttp answers HEAD where GET is, with the same scope
                added.append(app.router.add_route("HEAD", prefix + route.path, route.handler))
            scopes.update(dict.fromkeys(added, route.scope))
            if route.rollout:
                app.setdefault(AGENT_APIS, set()).update(added)


def mount_static(app: web.Application, prefix: str, path, scope: Scope) -> None:
    resource = app.router.add_static(prefix, path, follow_symlinks=False)
    scopes = app.setdefault(SCOPES, {})
    for added in resource:
        scopes[added] = scope


def scope_of(request: web.Request) -> Scope | None:
    """The scope the matched route needs; None where no route matched (a 404 or 405 to come)."""
    return request.app[SCOPES].get(request.match_info.route)


def takes_cookie(request: web.Request) -> bool:
    """Whether the viewer's session cookie may stand for the key here (viewer/session_cookie.py): on
    looptrace's own routes, never on the APIs agents call (a WebSocket there is not bound by a browser's
    same-origin rule, so a page on another port of the same host could use the cookie through it)."""
    return request.match_info.route not in request.app.get(AGENT_APIS, ())
