"""Keys and tenants (issue 55; api/auth.py, trace_store/api_keys.py): once a store holds a key, every
request needs one; a key sees its tenant's records alone, and another tenant's ids answer as unknown ones.

The hostile-tenant test replays every mounted route (route.py's table: a route added later is in it) as
a second tenant, with the first tenant's ids and a marker the first tenant's requests carried, and finds
the marker in no answer."""

from __future__ import annotations

import json
import uuid

import pytest

from looptrace.proxy.api.keys import TELEMETRY
from looptrace.proxy.settings import Settings
from looptrace.trace_store.api_keys import SECRET_ENV, KeyStore, server_secret

import hostile_tenant as hostile
from app_thread import AppThread
from hostile_tenant import GUARDED, MODEL, SESSION, path_of
from waiting import wait_until

MARKER = "papaya-" + uuid.uuid4().hex[:12]


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
        # bob holds every scope a tenant's key may: the hostile replay reaches every route past its scope.
        made = {"alice": keys.create("alice"), "bob": keys.create("bob", scopes=("infer", "traces:read", "erase", "export")),
                "reader": keys.create("reader", tenant="alice", scopes=("traces:read",)),
                "eraser": keys.create("eraser", tenant="alice", scopes=("traces:read", "erase")),
                "gone": keys.create("gone")}
        app.keys_made = made
        yield app, keys, made
        app.stop()


def call(app, key: str | None, method: str, path: str, body=None, headers: dict | None = None) -> tuple[int, bytes]:
    return hostile.call(app.url, key, method, path, body, headers)


def watched(app, key: str) -> tuple[int, bytes]:
    """The live feed as `key` sees it while alice writes a step (hostile_tenant.watched)."""
    def write() -> None:
        chat(app, alice_key(app), SESSION, MARKER)
        app.settled()

    return hostile.watched(app.url, key, write)


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
    """What alice left: a session, a trace, a stored response, a rollout's reward, all carrying MARKER."""
    app, _, made = server
    return hostile.leave_hers(app.url, made["alice"], MARKER, app.replay)


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


@pytest.mark.parametrize("route", GUARDED, ids=lambda r: f"{r.method} {r.path}")
def test_another_tenant_reads_nothing_of_hers_on_any_route(server, alices, route):
    app, _, made = server
    assert hostile.replay_route(app.url, made["bob"], route, alices, MARKER, replay=app.replay,
                                live=lambda: watched(app, made["bob"])) == []


@pytest.mark.parametrize("path", ["/v1/traces/{trace_id}", "/v1/traces/{trace_id}/prompt", "/v1/traces/{trace_id}/tokens",
                                  "/v1/sessions/{key}", "/v1/responses/{response_id}",
                                  "/v1/responses/{response_id}/input_items"])
def test_her_ids_are_unknown_to_him(server, alices, path):
    app, _, made = server
    assert call(app, made["bob"], "GET", path_of(path, alices))[0] == 404
    assert call(app, made["alice"], "GET", path_of(path, alices))[0] == 200


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


def test_routes_beyond_the_table_are_replayed_too(server, alices):
    """Any guarded route the app mounted that the surfaces' tables above do not list (a surface added
    later): replayed the same way, from the app's own router."""
    app, _, made = server
    beyond = [r for r in hostile.mounted(app.app) if (r.method, r.path) not in hostile.tabled()]
    leaked = [leak for route in beyond for leak in hostile.replay_route(app.url, made["bob"], route, alices, MARKER,
                                                                        replay=app.replay)]
    assert leaked == []


def test_her_records_are_whole_after_his_replay(server, alices):
    app, _, made = server
    session = json.loads(call(app, made["alice"], "GET", path_of("/v1/sessions/{key}", alices))[1])
    assert len(session["steps"]) >= 2 and MARKER in json.dumps(session)
    reward = json.loads(call(app, made["alice"], "GET", f"/v1/rollouts/{SESSION}/reward")[1])
    assert reward["rollout"] == SESSION and reward["reward"] == 1.0 and reward["info"] == {"note": MARKER}, reward


def test_rollouts_are_listed_within_the_tenant(server, alices):
    app, _, made = server
    hers = json.loads(call(app, made["alice"], "GET", "/v1/rollouts")[1])["data"]
    assert [(r["rollout"], r["group"]) for r in hers] == [(SESSION, f"group-{MARKER}")], hers  # as she names it
    # His own rollouts may bear her ids as names (his replay above made them): none is hers.
    his = json.loads(call(app, made["bob"], "GET", "/v1/rollouts")[1])["data"]
    assert MARKER not in json.dumps(his) and all(r["group"] is None for r in his), his
    assert json.loads(call(app, made["bob"], "GET", f"/v1/rollouts?group=group-{MARKER}")[1])["data"] == []
    everyone = json.loads(call(app, "operator-key", "GET", f"/v1/rollouts?group=group-{MARKER}")[1])["data"]
    assert [r["rollout"] for r in everyone] == [alices["session"]]  # the operator sees keys as kept


def test_his_erasure_of_her_session_answers_as_an_unknown_one(server, alices):
    app, _, made = server
    unknown = call(app, made["bob"], "DELETE", path_of("/v1/sessions/{key}", {**alices, "session": "alice/never"}))
    hers = call(app, made["bob"], "DELETE", path_of("/v1/sessions/{key}", alices))
    assert hers[0] == unknown[0] == 404 and json.loads(hers[1]) == json.loads(unknown[1]), (hers, unknown)
    assert call(app, made["alice"], "GET", path_of("/v1/sessions/{key}", alices))[0] == 200  # nothing of hers went
    assert call(app, made["alice"], "GET", path_of("/v1/responses/{response_id}", alices))[0] == 200
    assert call(app, made["alice"], "GET", f"/v1/rollouts/{SESSION}/reward")[0] == 200
    status, body = call(app, made["alice"], "DELETE", path_of("/v1/sessions/{key}", alices))
    assert status == 403 and json.loads(body)["error"]["code"] == "missing_scope"  # erasing is a scope of its own


def test_her_eraser_key_erases_her_session_and_her_list_says_so(server):
    app, _, made = server
    marker = "quince-" + uuid.uuid4().hex[:12]
    chat(app, made["alice"], "to-erase", marker)
    app.settled()
    key = "alice/to-erase"
    assert call(app, made["eraser"], "GET", f"/v1/sessions/{key.replace('/', '%2F')}")[0] == 200
    status, body = call(app, made["eraser"], "DELETE", f"/v1/sessions/{key.replace('/', '%2F')}")
    assert status == 200 and json.loads(body)["removed"]["traces"] == 1, body
    assert call(app, made["alice"], "GET", f"/v1/sessions/{key.replace('/', '%2F')}")[0] == 404
    hers = json.loads(call(app, made["eraser"], "GET", "/v1/erasures")[1])["data"]
    assert [(e["who"], e["kind"], e["subject"]) for e in hers] == [("eraser", "session", key)], hers
    assert marker not in json.dumps(hers)  # who, what, when: no content
    his = json.loads(call(app, made["bob"], "GET", "/v1/erasures")[1])["data"]
    assert key not in json.dumps(his) and all(e["who"] == "bob" for e in his), his  # his own attempts alone
    assert any(e["who"] == "eraser" for e in json.loads(call(app, "operator-key", "GET", "/v1/erasures")[1])["data"])


@pytest.mark.parametrize("fmt", ["jsonl", "atif"])
def test_export_by_tenant_takes_that_tenants_records_alone(server, alices, fmt, capsys):
    from looptrace.proxy.cli import main as cli

    app, _, made = server
    chat(app, made["bob"], "bobs-own", "mango")
    app.settled()
    exported = {}
    for tenant in ("alice", "bob", None):
        with pytest.raises(SystemExit) as exit_:
            cli(["export", "--store", app.settings.trace_db, "--since", "0", "--format", fmt,
                 *(["--tenant", tenant] if tenant else [])])
        assert exit_.value.code == 0, capsys.readouterr().err
        rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        exported[tenant] = ({r["session"] if fmt == "jsonl" else r["extra"]["session"] for r in rows}, json.dumps(rows))
    for tenant in ("alice", "bob"):  # each tenant's export: of the sessions its keys list alone (a step that
        listed = json.loads(call(app, made[tenant], "GET", "/v1/sessions?limit=500")[1])["data"]  # failed has none)
        assert exported[tenant][0] <= {s["key"] for s in listed}, tenant
    assert alices["session"] in exported["alice"][0] and "bob/bobs-own" in exported["bob"][0]
    assert MARKER not in exported["bob"][1] and (fmt == "jsonl" or MARKER in exported["alice"][1])
    assert exported[None][0] >= exported["alice"][0] | exported["bob"][0]  # the operator's: everyone's
    with pytest.raises(SystemExit) as exit_:  # her session named, as bob's tenant: as one never stored
        cli(["export", "--store", app.settings.trace_db, "--session", alices["session"], "--tenant", "bob"])
    assert exit_.value.code == 2 and "no session" in capsys.readouterr().err
