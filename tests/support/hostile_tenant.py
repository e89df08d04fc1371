"""The hostile-tenant replay (issue 55), for any server with two tenants' keys: the first tenant ("her")
leaves a session, a trace, a stored response and a rollout's reward, each carrying a marker; the
second replays every route of the route table with her ids (in the path, in the query, in
`previous_response_id`, as its session header) and no answer may hold the marker.

tests/unit/test_tenants.py runs it against the app on a thread (SQLite); tests/integration/
test_tenants_workers.py against `looptrace serve --workers 2` on PostgreSQL. The routes come from
the surfaces' own tables (route.py), and `mounted` reads an app's router for any route beyond them (a
surface added later is replayed too)."""

from __future__ import annotations

import http.client
import json
import re
import urllib.parse
import urllib.request
from collections.abc import Callable
from urllib.parse import urlsplit

from looptrace.proxy.api import anthropic, monitoring, native, openai, rollouts, viewer
from looptrace.proxy.api.clients import ROLLOUT_PREFIX
from looptrace.proxy.api.route import SCOPES, Route, Scope

from waiting import wait_until

MODEL = "tiny"
SURFACES = (monitoring, openai, anthropic, native, rollouts, viewer)
ROUTES = [route for surface in SURFACES for route in surface.ROUTES]
GUARDED = [route for route in ROUTES if route.scope is not Scope.PUBLIC]
SESSION = "shared-name"  # both tenants name a session so: two sessions


def tabled() -> set[tuple[str, str]]:
    """(method, path as aiohttp names it) of every route in GUARDED, under /r/{rollout}/ too."""
    return {(r.method, prefix + re.sub(r"\{(\w+):[^}]+\}", r"{\1}", r.path))
            for r in GUARDED for prefix in (("", ROLLOUT_PREFIX) if r.rollout else ("",))}


def mounted(app) -> list[Route]:
    """Every route an aiohttp app mounted that needs a key (its router: /r/{rollout}/ ones each on its own)."""
    scopes = app[SCOPES]
    return [Route(r.method, r.resource.canonical, r.handler, scopes[r]) for r in app.router.routes()
            if r.method != "HEAD" and scopes.get(r, Scope.PUBLIC) is not Scope.PUBLIC]


def call(url: str, key: str | None, method: str, path: str, body=None, headers: dict | None = None) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    sent = {"Content-Type": "application/json", **(headers or {})}
    if key is not None:
        sent["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url + path, data=data, method=method, headers=sent)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def answered(url: str, key: str, method: str, path: str, body=None, headers: dict | None = None) -> dict:
    status, data = call(url, key, method, path, body, headers)
    assert status == 200, (method, path, status, data[:500])
    return json.loads(data)


def leave_hers(url: str, key: str, marker: str, replay: Callable[[str], None] = lambda text: None) -> dict:
    """Her records, each holding `marker`: a chat and a stored response in her session (the second also
    her rollout's request, in a group named after the marker), and the rollout's reward. `replay`: the
    answer the next request gets, where the test sets it. Her ids, once the store holds them."""
    replay(f"\n</think>\n\nNoted {marker}.<|im_end|>")
    answered(url, key, "POST", "/v1/chat/completions",
             {"model": MODEL, "messages": [{"role": "user", "content": f"remember {marker}"}]}, {"session_id": SESSION})
    replay(f"\n</think>\n\nStored {marker}.<|im_end|>")
    response_id = answered(url, key, "POST", "/v1/responses", {"model": MODEL, "input": f"keep {marker}", "store": True},
                           {"session_id": SESSION, "X-Rollout-Id": SESSION, "X-Rollout-Group": f"group-{marker}"})["id"]

    def stored() -> dict | None:
        listed = [s for s in answered(url, key, "GET", "/v1/sessions")["data"] if s["key"].endswith(SESSION)]
        return listed[0] if listed and listed[0]["steps"] == 2 else None

    session = wait_until(stored, timeout=30, every=0.1, what="her two steps stored")
    answered(url, key, "POST", f"/v1/rollouts/{SESSION}/reward", {"reward": 1.0, "info": {"note": marker}})
    return {"session": session["key"], "trace_id": session["last_trace_id"], "response_id": response_id}


def watched(url: str, key: str, write: Callable[[], None]) -> tuple[int, bytes]:
    """GET /v1/live (a stream that never ends) while `write` stores another request of hers: what it sent
    until that step was stored and the feed had its turn (one keepalive interval is not waited for)."""
    where = urlsplit(url)
    connection = http.client.HTTPConnection(where.hostname, where.port, timeout=30)
    connection.request("GET", "/v1/live", headers={"Authorization": f"Bearer {key}"})
    response = connection.getresponse()
    first = response.fp.readline() + response.fp.readline()  # ": watching" and its blank line
    write()
    response.fp.raw._sock.settimeout(1.0)  # the watcher has had the step, or has filtered it out
    rest = b""
    try:
        while True:
            line = response.fp.readline()
            if not line:
                break
            rest += line
    except TimeoutError:
        pass
    connection.close()
    return response.status, first + rest


def path_of(template: str, ids: dict) -> str:
    values = {"trace_id": ids["trace_id"], "response_id": ids["response_id"], "key": ids["session"],
              "rollout": ids["session"], "keys": f"{ids['session']}/{ids['session']}"}
    return re.sub(r"\{(\w+)(:[^}]+)?\}", lambda m: urllib.parse.quote(values.get(m.group(1), "x"), safe=""), template)


def bodies(ids: dict) -> list:
    """What a hostile tenant would post: her ids wherever a body may name one."""
    return [{"model": MODEL, "input": "what did they say?", "previous_response_id": ids["response_id"]},
            {"model": MODEL, "messages": [{"role": "user", "content": "and before?"}], "trace_id": ids["trace_id"]},
            {"index": 1, "reward": 1.0}]


def replay_route(url: str, key: str, route: Route, ids: dict, marker: str, *,
                 replay: Callable[[str], None] = lambda text: None,
                 live: Callable[[], tuple[int, bytes]] | None = None) -> list[tuple]:
    """Every call of `route` a hostile tenant makes with her ids, as `key`: the calls whose answer held
    `marker` (her ids may come back in a 404 that repeats what he sent; nothing she wrote may)."""
    leaked = []
    for prefix in ("", ROLLOUT_PREFIX) if route.rollout else ("",):
        path = path_of(prefix + route.path, ids)
        queries = ["", f"?a={ids['session']}&b={ids['session']}", f"?key={ids['session']}",
                   f"?conversation={ids['session']}&q={marker}", f"?group=group-{marker}"]
        for query in queries if route.method == "GET" else [""]:
            for body in bodies(ids) if route.method == "POST" else [None]:
                replay("\n</think>\n\nnothing.<|im_end|>")
                if path.startswith("/v1/live") and live is not None:
                    status, answer = live()
                else:
                    status, answer = call(url, key, route.method, path + query, body, {"session_id": ids["session"]})
                if marker.encode() in answer:
                    leaked.append((route.method, path + query, body, status, answer[:500]))
    return leaked
