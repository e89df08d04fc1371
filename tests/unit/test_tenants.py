"""Keys and tenants (issue 55; api/auth.py, trace_store/api_keys.py): once a store holds a key, every
request needs one; a key sees its tenant's records alone, and another tenant's ids answer as unknown ones.

The hostile-tenant test replays every mounted route (route.py's table: a route added later is in it) as
a second tenant, with the first tenant's ids and a marker the first tenant's requests carried, and finds
the marker in no answer."""

from __future__ import annotations

import json
import re
import urllib.request
import uuid

import pytest

from looptrace.proxy.api import anthropic, monitoring, native, openai, rollouts, viewer
from looptrace.proxy.api.clients import ROLLOUT_PREFIX
from looptrace.proxy.api.keys import TELEMETRY
from looptrace.proxy.api.route import Scope
from looptrace.proxy.settings import Settings
from looptrace.trace_store.api_keys import SECRET_ENV, KeyStore, server_secret

from app_thread import AppThread
from waiting import wait_until

MODEL = "tiny"
MARKER = "papaya-" + uuid.uuid4().hex[:12]
ALL = [route for surface in (monitoring, openai, anthropic, native, rollouts, viewer) for route in surface.ROUTES]


@pytest.fixture(scope="module")
def server(qwen3_5_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tenants")
    (folder / "none.jsonl").write_text('{"text": "unused"}\n')
    with pytest.MonkeyPatch.context() as env:
        env.setenv(SECRET_ENV, "tenant-test-secret")  # never this machine's own secret file
        app = AppThread(Settings(model=str(qwen3_5_dir), backend="replay", replay=str(folder / "none.jsonl"),
                                 served_model_name=MODEL, trace_db=str(folder / "traces.sqlite3"),
                                 api_key="operator-key")).start()
        keys = KeyStore(app.app[TELEMETRY].state, server_secret())
        made = {"alice": keys.create("alice"), "bob": keys.create("bob"),
                "reader": keys.create("reader", tenant="alice", scopes=("traces:read",)),
                "gone": keys.create("gone")}
        app.keys_made = made
        yield app, keys, made
        app.stop()


def call(app, key: str | None, method: str, path: str, body=None, headers: dict | None = None) -> tuple[int, bytes]:
    if path.startswith("/v1/live"):
        return watched(app, key)
    data = json.dumps(body).encode() if body is not None else None
    sent = {"Content-Type": "application/json", **(headers or {})}
    if key is not None:
        sent["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(app.url + path, data=data, method=method, headers=sent)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def watched(app, key: str) -> tuple[int, bytes]:
    """GET /v1/live (a stream that never ends) while another request of hers is stored: what it sent
    until that step was stored and the feed had its turn (one keepalive interval is not waited for)."""
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", app.port, timeout=30)
    connection.request("GET", "/v1/live", headers={"Authorization": f"Bearer {key}"})
    response = connection.getresponse()
    first = response.fp.readline() + response.fp.readline()  # ": watching" and its blank line
    chat(app, alice_key(app), "shared-name", MARKER)  # she writes now: the feed has a step of hers
    app.settled()
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


def alice_key(app) -> str:
    return app.keys_made["alice"]


def chat(app, key, session: str, text: str) -> dict:
    app.replay(f"\n</think>\n\nNoted {text}.<|im_end|>")
    status, body = call(app, key, "POST", "/v1/chat/completions",
                        {"model": MODEL, "messages": [{"role": "user", "content": f"remember {text}"}]},
                        {"session_id": session})
    assert status == 200, body
    return json.loads(body)


@pytest.fixture(scope="module")
def alices(server):
    """What alice left: a session, a trace, a stored response, all carrying MARKER."""
    app, _, made = server
    chat(app, made["alice"], "shared-name", MARKER)
    app.replay(f"\n</think>\n\nStored {MARKER}.<|im_end|>")
    status, body = call(app, made["alice"], "POST", "/v1/responses",
                        {"model": MODEL, "input": f"keep {MARKER}", "store": True},
                        {"session_id": "shared-name"})
    assert status == 200, body
    response_id = json.loads(body)["id"]
    app.settled()
    status, body = call(app, made["alice"], "GET", "/v1/sessions")
    sessions = json.loads(body)["data"]
    (session,) = [s for s in sessions if s["key"].endswith("shared-name")]
    return {"session": session["key"], "trace_id": session["last_trace_id"], "response_id": response_id}


def test_a_store_with_keys_asks_every_request_for_one(server):
    app, _, made = server
    assert call(app, None, "GET", "/v1/models")[0] == 401
    assert call(app, "lt-" + "x" * 43, "GET", "/v1/models")[0] == 401
    assert call(app, made["alice"], "GET", "/v1/models")[0] == 200
    assert call(app, "operator-key", "GET", "/v1/models")[0] == 200  # --api-key: the operator's key
    assert call(app, None, "GET", "/health")[0] == 200  # public: probes need no key


def test_a_key_needs_the_routes_scope(server):
    app, _, made = server
    status, body = call(app, made["reader"], "POST", "/v1/chat/completions",
                        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert status == 403 and json.loads(body)["error"]["code"] == "missing_scope", body
    assert call(app, made["reader"], "GET", "/v1/sessions")[0] == 200


def test_a_revoked_key_is_refused_within_a_second(server):
    app, keys, made = server
    assert call(app, made["gone"], "GET", "/v1/models")[0] == 200
    assert keys.revoke("gone")
    status, body = wait_until(lambda: (lambda r: r if r[0] == 401 else None)(call(app, made["gone"], "GET", "/v1/models")),
                              timeout=5, every=0.1, what="the revoked key refused")
    assert b"revoked" in body


def test_the_store_keeps_no_key(server, tmp_path):
    app, keys, made = server
    state_files = [p for p in app.app[TELEMETRY].state.path.parent.iterdir() if p.is_file()]
    for path in state_files:
        data = path.read_bytes()
        for key in made.values():
            assert key.encode() not in data, path
    assert all(k.name != "x" for k in keys.listed()) and "digest" not in json.dumps([k.listed() for k in keys.listed()])


def test_each_tenant_sees_its_own_sessions_alone(server, alices):
    app, _, made = server
    chat(app, made["bob"], "shared-name", "mango")  # the same session name: another session
    app.settled()
    mine = json.loads(call(app, made["bob"], "GET", "/v1/sessions")[1])["data"]
    assert [s["steps"] for s in mine] == [1] and MARKER not in json.dumps(mine), mine
    hers = json.loads(call(app, made["alice"], "GET", "/v1/sessions")[1])["data"]
    assert {s["key"] for s in hers} == {alices["session"]} and hers[0]["steps"] == 2, hers
    # alice's reader key (her tenant) sees hers; the operator sees both.
    assert {s["key"] for s in json.loads(call(app, made["reader"], "GET", "/v1/sessions")[1])["data"]} == \
        {alices["session"]}
    assert len(json.loads(call(app, "operator-key", "GET", "/v1/sessions")[1])["data"]) == 2


def _path(template: str, ids: dict) -> str:
    values = {"trace_id": ids["trace_id"], "response_id": ids["response_id"], "key": ids["session"],
              "rollout": ids["session"], "keys": f"{ids['session']}/{ids['session']}"}
    return re.sub(r"\{(\w+)(:[^}]+)?\}", lambda m: urllib.request.quote(values.get(m.group(1), "x"), safe=""),
                  template)


def _bodies(route_path: str, ids: dict) -> list:
    """What a hostile tenant would post: the other tenant's ids wherever a body may name one."""
    return [{"model": MODEL, "input": "what did they say?", "previous_response_id": ids["response_id"]},
            {"model": MODEL, "messages": [{"role": "user", "content": "and before?"}], "trace_id": ids["trace_id"]},
            {"index": 1, "reward": 1.0}]


@pytest.mark.parametrize("route", [r for r in ALL if r.scope is not Scope.PUBLIC], ids=lambda r: f"{r.method} {r.path}")
def test_another_tenant_reads_nothing_of_hers_on_any_route(server, alices, route):
    app, _, made = server
    for prefix in ("", ROLLOUT_PREFIX) if route.rollout else ("",):
        path = _path(prefix + route.path, alices)
        queries = ["", f"?a={alices['session']}&b={alices['session']}", f"?key={alices['session']}",
                   f"?conversation={alices['session']}&q={MARKER}"]
        for query in queries if route.method == "GET" else [""]:
            for body in _bodies(path, alices) if route.method == "POST" else [None]:
                app.replay(f"\n</think>\n\nnothing.<|im_end|>")
                status, answer = call(app, made["bob"], route.method, path + query, body,
                                      {"session_id": alices["session"]})
                # Her ids may come back in a 404 that repeats what he sent; nothing she wrote may.
                assert MARKER.encode() not in answer, (route, path + query, body, status, answer[:500])


@pytest.mark.parametrize("path", ["/v1/traces/{trace_id}", "/v1/traces/{trace_id}/prompt", "/v1/traces/{trace_id}/tokens",
                                  "/v1/sessions/{key}", "/v1/responses/{response_id}",
                                  "/v1/responses/{response_id}/input_items"])
def test_her_ids_are_unknown_to_him(server, alices, path):
    app, _, made = server
    assert call(app, made["bob"], "GET", _path(path, alices))[0] == 404
    assert call(app, made["alice"], "GET", _path(path, alices))[0] == 200


def test_her_compaction_is_unknown_to_him(server):
    # A compaction item carries a reference to the summary the server keeps: kept within its tenant.
    app, _, made = server
    app.replay(f"\n</think>\n\nSummary: {MARKER} was said.<|im_end|>")
    status, body = call(app, made["alice"], "POST", "/v1/responses",
                        {"model": MODEL, "store": False, "input": [{"role": "user", "content": "hello"},
                                                                   {"type": "compaction_trigger"}]})
    assert status == 200, body
    (item,) = json.loads(body)["output"]
    assert item["type"] == "compaction" and MARKER.encode() not in json.dumps(item).encode()
    later = {"model": MODEL, "store": False, "input": [item, {"role": "user", "content": "go on"}]}
    app.replay("\n</think>\n\nok.<|im_end|>")
    status, body = call(app, made["bob"], "POST", "/v1/responses", later)
    assert status == 400 and json.loads(body)["error"]["code"] == "invalid_encrypted_content", body
    assert MARKER.encode() not in body and b"no summary of that id" in body  # as for an id never made
    app.replay("\n</think>\n\nok.<|im_end|>")
    assert call(app, made["alice"], "POST", "/v1/responses", later)[0] == 200
