"""Two tenants' keys against `looptrace serve --workers 2` on PostgreSQL (issue 55): the hostile-tenant
replay of tests/unit/test_tenants.py (support/hostile_tenant.py), every route the app mounts, with her
ids, each call a connection of its own that the kernel gives to either worker. No answer holds her
marker, and afterwards her records are whole: the workers share the keys, the traces and the state in
the store, and every read there is filtered by the caller's tenant."""

from __future__ import annotations

import json
import uuid

import pytest

from looptrace.proxy.api.app import create_app
from looptrace.proxy.settings import Settings
from looptrace.trace_store.api_keys import SECRET_ENV, KeyStore, server_secret

import hostile_tenant as hostile
import stores as store_kinds
from hostile_tenant import MODEL, SESSION, answered, call, path_of
from server_workers import all_ready
from waiting import wait_until

MARKER = "papaya-" + uuid.uuid4().hex[:12]
SECRET = "tenant-workers-secret"


@pytest.fixture(scope="module")
def fleet(serve, qwen3_5_dir, postgres_url, tmp_path_factory):
    """The server's two workers ready on one PostgreSQL store holding alice's and bob's keys."""
    folder = tmp_path_factory.mktemp("tenant-workers")
    made = store_kinds.Stores("postgresql", folder, postgres_url)
    url = made.setting()
    steps = folder / "steps.jsonl"  # every answer the same, and none holds the marker: it is in her requests
    steps.write_text((json.dumps({"text": "\n</think>\n\nok.<|im_end|>"}) + "\n") * 4000)
    with pytest.MonkeyPatch.context() as env:
        env.setenv(SECRET_ENV, SECRET)
        state = made.state(url)
        keys = KeyStore(state, server_secret())
        made_keys = {"alice": keys.create("alice"),
                     "bob": keys.create("bob", scopes=("infer", "traces:read", "erase", "export"))}
        state.close()
    server = serve(str(qwen3_5_dir), "--backend", "replay", "--replay", str(steps), "--served-model-name", MODEL,
                   "--workers", "2", "--trace-db", url, env={SECRET_ENV: SECRET}, api_key="operator-key")
    server.wait_until(lambda: all_ready(server.log(), 2), 300)
    yield server, made_keys, folder
    server.stop()  # before its schema is dropped
    made.close()


def test_another_tenant_reads_nothing_of_hers_on_any_route_of_two_workers(fleet):
    server, keys, folder = fleet
    alice, bob = keys["alice"], keys["bob"]
    ids = hostile.leave_hers(server.url, alice, MARKER)
    (folder / "none.jsonl").write_text('{"text": "unused"}\n')
    app = create_app(Settings(model="unused", backend="replay", replay=str(folder / "none.jsonl"),
                              served_model_name=MODEL, trace_db=str(folder / "routes.sqlite3")))
    routes = hostile.mounted(app)  # every route the server mounts: its own router's, built the same way
    assert {(r.method, r.path) for r in routes} >= hostile.tabled()

    def write() -> None:  # another step of hers, stored while he watches the live feed
        steps = answered(server.url, alice, "GET", path_of("/v1/sessions/{key}", ids))["steps_total"]
        answered(server.url, alice, "POST", "/v1/chat/completions",
                 {"model": MODEL, "messages": [{"role": "user", "content": f"remember {MARKER}"}]},
                 {"session_id": SESSION})
        wait_until(lambda: answered(server.url, alice, "GET", path_of("/v1/sessions/{key}", ids))["steps_total"]
                   > steps, timeout=30, every=0.1, what="her next step stored")

    leaked = [leak for route in routes for leak in hostile.replay_route(
        server.url, bob, route, ids, MARKER, live=lambda: hostile.watched(server.url, bob, write))]
    assert leaked == [], leaked[:5]

    # Her records are whole: his erasure of her session, his posts with her ids, changed nothing of hers.
    session = answered(server.url, alice, "GET", path_of("/v1/sessions/{key}", ids))
    assert session["steps_total"] >= 2 and MARKER in json.dumps(session)
    assert MARKER in json.dumps(answered(server.url, alice, "GET", path_of("/v1/traces/{trace_id}/prompt", ids)))
    assert answered(server.url, alice, "GET", path_of("/v1/responses/{response_id}", ids))["id"] == ids["response_id"]
    reward = answered(server.url, alice, "GET", f"/v1/rollouts/{SESSION}/reward")
    assert reward["reward"] == 1.0 and reward["info"] == {"note": MARKER}, reward
    hers = answered(server.url, alice, "GET", "/v1/rollouts")["data"]
    assert [(r["rollout"], r["group"]) for r in hers] == [(SESSION, f"group-{MARKER}")], hers
    assert answered(server.url, bob, "GET", f"/v1/rollouts?group=group-{MARKER}")["data"] == []
    for path in ("/v1/traces/{trace_id}", "/v1/sessions/{key}", "/v1/responses/{response_id}"):
        assert call(server.url, bob, "GET", path_of(path, ids))[0] == 404
