"""Erasure (trace_store/erasure.py): a session with a unique marker in its prompt, a tool's result and the
model's output, sent through the real application (Chat Completions, and Responses with store=true),
then erased by DELETE /v1/sessions/{key} and, separately, by `looptrace erase` against the running
server's store: the marker is in no byte of any SQLite file beside the store (nor in any PostgreSQL
row), the session's ids answer 404, another session is whole, and the erasure is listed."""

from __future__ import annotations

import json
import sqlite3
import threading
import uuid
from pathlib import Path

import pytest

from looptrace.proxy.cli import main as cli
from looptrace.proxy.settings import Settings

import stores as store_kinds
from app_thread import AppThread

TOOL = {"type": "function", "function": {"name": "read_file", "description": "Read a file",
                                         "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}


@pytest.fixture(scope="module", params=store_kinds.KINDS)
def served(request, qwen3_5_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("erasure")
    made = store_kinds.of_param(request, folder)
    placeholder = folder / "none.jsonl"
    placeholder.write_text('{"text": "unused"}\n')
    store_folder = folder / "store"  # the store's files alone: every file here is grepped
    setting = str(store_folder / "traces.sqlite3") if made.kind == "sqlite" else made.setting()
    app = AppThread(Settings(model=str(qwen3_5_dir), backend="replay", replay=str(placeholder),
                             served_model_name="tiny-qwen", trace_db=setting)).start()
    yield made, app, store_folder
    app.stop()
    made.close()


def session(app: AppThread, key: str, marker: str) -> dict:
    """A session holding `marker` in a prompt, a tool's result and the model's outputs: two Chat
    Completions turns and two Responses turns (store=true, the second continuing the first)."""
    headers = {"session_id": key}
    app.replay(f"Reading it. {marker}", f"The file says {marker}.", f"Noted {marker}.", f"Again {marker}.")
    messages = [{"role": "user", "content": f"Read notes.txt, it mentions {marker}"}]
    status, first = app.call("POST", "/v1/chat/completions", {"model": "tiny-qwen", "messages": messages,
                                                              "tools": [TOOL]}, headers)
    assert status == 200, first
    messages += [{"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
                     "name": "read_file", "arguments": json.dumps({"path": "notes.txt"})}}]},
                 {"role": "tool", "tool_call_id": "call_1", "content": f"secret plan: {marker}"}]
    status, second = app.call("POST", "/v1/chat/completions", {"model": "tiny-qwen", "messages": messages,
                                                               "tools": [TOOL]}, headers)
    assert status == 200, second
    status, response = app.call("POST", "/v1/responses", {"model": "tiny-qwen", "store": True,
                                                          "input": f"Remember {marker}"}, headers)
    assert status == 200, response
    status, later = app.call("POST", "/v1/responses", {"model": "tiny-qwen", "store": True, "input": "And?",
                                                       "previous_response_id": response["id"]}, headers)
    assert status == 200, later
    found = app.stored(f"/v1/sessions/{key}", steps=4)
    return {"traces": [s["trace_id"] for s in found["steps"]], "responses": [response["id"], later["id"]]}


def occurrences(made, app: AppThread, folder: Path, marker: str) -> dict[str, int]:
    """Where the marker is: each SQLite file's bytes (the traces, the state, their -wal and -shm; the
    FTS index lowercases words), or each PostgreSQL table's rows (text, and bytea as hex)."""
    needles = [marker.encode(), marker.lower().encode()]
    if made.kind == "sqlite":
        return {path.name: sum(path.read_bytes().count(n) for n in needles)
                for path in sorted(folder.iterdir()) if path.is_file()}
    import psycopg

    hexed = marker.encode().hex()
    with psycopg.connect(app.settings.trace_db, autocommit=True) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()").fetchall()]
        return {table: conn.execute(f"SELECT count(*) FROM {table} t WHERE t::text ILIKE %s OR t::text LIKE %s",
                                    (f"%{marker}%", f"%{hexed}%")).fetchone()[0] for table in tables}


def gone(app: AppThread, ids: dict, key: str) -> None:
    assert app.call("GET", f"/v1/sessions/{key}")[0] == 404
    assert [app.call("GET", f"/v1/traces/{t}")[0] for t in ids["traces"]] == [404] * len(ids["traces"])
    for response_id in ids["responses"]:
        assert app.call("GET", f"/v1/responses/{response_id}")[0] == 404
        assert app.call("GET", f"/v1/responses/{response_id}/input_items")[0] == 404
    app.replay("unused")
    status, answer = app.call("POST", "/v1/responses", {"model": "tiny-qwen", "input": "more",
                                                        "previous_response_id": ids["responses"][-1]})
    assert status == 404 and answer["error"]["code"] == "previous_response_not_found", answer


def whole(app: AppThread, ids: dict, key: str) -> None:
    assert len(app.call("GET", f"/v1/sessions/{key}")[1]["steps"]) == len(ids["traces"])
    assert [app.call("GET", f"/v1/traces/{t}")[0] for t in ids["traces"]] == [200] * len(ids["traces"])
    assert [app.call("GET", f"/v1/responses/{r}")[0] for r in ids["responses"]] == [200, 200]


@pytest.mark.parametrize("how", ["api", "cli"])
def test_an_erased_session_leaves_no_byte_and_its_ids_answer_404(served, how, capsys):
    made, app, folder = served
    marker, kept_marker = (f"ZQX{uuid.uuid4().hex[:10].upper()}" for _ in range(2))
    key, kept = f"erased-{how}", f"kept-{how}"
    ids, kept_ids = session(app, key, marker), session(app, kept, kept_marker)
    before = occurrences(made, app, folder, marker)
    # The marker was written into the traces; the state beside them holds it sealed (trace_store/sealing.py),
    # and its rows' removal is counted below.
    if made.kind == "sqlite":
        assert before.get("traces.sqlite3", 0) + before.get("traces.sqlite3-wal", 0) > 0, before
        assert before.get("traces.state.sqlite3", 0) + before.get("traces.state.sqlite3-wal", 0) == 0, before
    else:
        assert before["spans"] and before["trace_text"] and not before["state_responses"], before
    if how == "api":
        status, done = app.call("DELETE", f"/v1/sessions/{key}")
        assert status == 200, done
    else:  # against the running server's store, as an operator would, while it serves another session
        busy = threading.Thread(target=lambda: answered.extend(
            app.call("POST", "/v1/chat/completions", {"model": "tiny-qwen", "messages": [
                {"role": "user", "content": f"meanwhile {n}"}]}, {"session_id": "meanwhile"})[0] for n in range(8)))
        answered: list[int] = []
        app.replay(*(f"busy {n}" for n in range(8)))
        busy.start()
        with pytest.raises(SystemExit) as exit_:
            cli(["erase", "--session", key, "--store", app.settings.trace_db])
        busy.join(60)
        assert exit_.value.code == 0, capsys.readouterr().err
        done = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert answered == [200] * 8
        assert len(app.stored("/v1/sessions/meanwhile")["steps"]) == 8  # none lost while the erasure held the file
    if made.kind == "sqlite":
        for name in ("traces.sqlite3", "traces.state.sqlite3"):
            with sqlite3.connect(folder / name) as db:
                assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    removed = done["removed"]
    assert removed["traces"] == len(ids["traces"]) and removed["spans"] > 0 and removed["sessions"] == 1, done
    assert removed["state_responses"] == 2, done
    assert {k: v for k, v in occurrences(made, app, folder, marker).items() if v} == {}
    gone(app, ids, key)
    whole(app, kept_ids, kept)
    assert sum(occurrences(made, app, folder, kept_marker).values()) > 0  # the other session's text stays
    status, listed = app.call("GET", "/v1/erasures")
    assert status == 200 and any(e["subject"] == key and e["kind"] == "session" and
                                 e["who"] == ("open" if how == "api" else "cli") for e in listed["data"]), listed
    assert marker not in json.dumps(listed)  # who, what, when: no content
    # The server goes on storing after the erasure: a new session is written and read back.
    later = session(app, f"after-{how}", "ordinary")
    assert len(later["traces"]) == 4


def test_erasing_an_unknown_session_is_a_404(served):
    _, app, _ = served
    status, answer = app.call("DELETE", "/v1/sessions/no-such-session")
    assert status == 404 and answer["error"]["code"] == "session_not_found", answer


def test_the_command_line_refuses_a_bad_date_and_lists_erasures(served, capsys):
    _, app, _ = served
    with pytest.raises(SystemExit) as exit_:
        cli(["erase", "--before", "yesterday-ish", "--store", app.settings.trace_db])
    assert exit_.value.code == 2 and "not an ISO 8601 date" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        cli(["erase", "--list", "--store", app.settings.trace_db])
    assert exit_.value.code == 0


def test_retention_prunes_the_state_of_the_conversations_whose_traces_went(served):
    """--trace-retention-days: a session's traces past their age go, and with them its conversation's
    state and its stored responses; another session's stay."""
    made, app, _ = served
    old, young = session(app, "aged", "ZQXAGED"), session(app, "young", "ZQXYOUNG")
    store = made.make(app.settings.trace_db)
    state = made.state(app.settings.trace_db)
    try:
        def held(key: str, ids: dict) -> list[int]:
            return [state._read([(sql, args)])[0][0][0] for sql, args in (
                ("SELECT count(*) FROM state_conversations WHERE key = ?", (key,)),
                ("SELECT count(*) FROM state_turns WHERE key = ?", (key,)),
                ("SELECT count(*) FROM state_responses WHERE id IN (?, ?)", tuple(ids["responses"])))]

        assert held("aged", old) == [1, 1, 2] and held("young", young) == [1, 1, 2]
        made.sql(store, "UPDATE traces SET start_ns = 1 WHERE session = ?", ("aged",))  # long ago
        store.enforce_retention()
        assert app.call("GET", "/v1/sessions/aged")[0] == 404
        assert held("aged", old) == [0, 0, 0]
        assert held("young", young) == [1, 1, 2]
        assert [app.call("GET", f"/v1/responses/{r}")[0] for r in old["responses"]] == [404, 404]
    finally:
        state.close()


def test_erasing_before_a_date_keeps_the_later_steps_whole(served, capsys):
    """--before: the steps older than the date go; a later step stored as what it adds to one of them is
    made whole first, so it reads as before (chains.py)."""
    made, app, _ = served
    ids = session(app, "dated", "ZQXDATED")
    first, later = ids["traces"][0], ids["traces"][1]
    expected = app.stored(f"/v1/traces/{later}/prompt")
    store = made.make(app.settings.trace_db)
    bases = made.sql(store, "SELECT base FROM trace_bases WHERE trace_id = ? AND kind = 'prompt'", (later,))
    assert bases == [(first,)]  # stored as what it adds to the first step
    made.sql(store, "UPDATE traces SET start_ns = ? WHERE trace_id = ?", (946684800 * 10**9 - 1, first))
    with pytest.raises(SystemExit) as exit_:
        cli(["erase", "--before", "2000-01-01", "--store", app.settings.trace_db])
    assert exit_.value.code == 0, capsys.readouterr().err
    done = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert done["kind"] == "before" and done["removed"]["traces"] == 1, done
    assert app.call("GET", f"/v1/traces/{first}")[0] == 404
    assert app.stored(f"/v1/traces/{later}/prompt") == expected
    assert made.sql(store, "SELECT base FROM trace_bases WHERE trace_id = ? AND kind = 'prompt'", (later,)) == [(None,)]


def test_erasing_a_tenant_takes_every_session_of_its_own(served, capsys):
    """--tenant T: every session whose traces carry tenant T goes; another tenant's stays. (The tenant is
    set here by SQL: what a key's requests record, schema version 6.)"""
    made, app, folder = served
    store = made.make(app.settings.trace_db)
    has = [r[1] for r in made.sql(store, "PRAGMA table_info(traces)")] if made.kind == "sqlite" else \
        [r[0] for r in made.sql(store, "SELECT column_name FROM information_schema.columns WHERE table_name = 'traces' "
                                       "AND table_schema = current_schema()")]
    if "tenant" not in has:
        with pytest.raises(SystemExit) as exit_:
            cli(["erase", "--tenant", "acme", "--store", app.settings.trace_db])
        assert exit_.value.code == 2 and "no tenant" in capsys.readouterr().err
        pytest.skip("this store's schema has no tenant column yet (the keys' schema version adds it)")
    marker = f"ZQX{uuid.uuid4().hex[:10].upper()}"
    ids = [session(app, f"acme-{n}", marker) for n in range(2)]
    other = session(app, "globex-1", "ZQXGLOBEX")
    for n in range(2):
        made.sql(store, "UPDATE traces SET tenant = 'acme' WHERE session = ?", (f"acme-{n}",))
    made.sql(store, "UPDATE traces SET tenant = 'globex' WHERE session = 'globex-1'")
    with pytest.raises(SystemExit) as exit_:
        cli(["erase", "--tenant", "acme", "--store", app.settings.trace_db])
    assert exit_.value.code == 0, capsys.readouterr().err
    for n, found in enumerate(ids):
        gone(app, found, f"acme-{n}")
    whole(app, other, "globex-1")
    assert {k: v for k, v in occurrences(made, app, folder, marker).items() if v} == {}
