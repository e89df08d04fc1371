"""The state store's records of a client's text sealed at rest (trace_store/sealing.py): a stored
response, its conversation, a compaction's summary and a turn's ids read back whole by every process
sharing the key secret, and their text is in no byte of the files or the database; under another
secret, or moved to another tenant's key, they read as unknown (a 404), said in one log line; rows
written before sealing still read. On SQLite and PostgreSQL alike."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from looptrace.proxy.api.errors import APIError
from looptrace.proxy.api.openai.responses.store import SharedResponseStore
from looptrace.trace_store import state as state_module
from looptrace.trace_store.api_keys import SECRET_ENV
from looptrace.trace_store.sealing import Sealer, is_sealed
from looptrace.trace_store.sqlite.state import sqlite_state_path

MARKER = "sealed-marker-7f3c9e"
TEXT = f"my .env says API_TOKEN={MARKER}"
IDS = [9107, 220, 3214, 77, 15]  # a turn's ids: packed, they would be findable as bytes too


def _fill(state) -> None:
    state.put_response("alice/resp_1", f'[{{"content": "{TEXT}"}}]', f'{{"id": "resp_1", "text": "{TEXT}"}}',
                       100, max_responses=10, max_bytes=1 << 20)
    state.put_compaction("cmp_1", f"SUMMARY: {TEXT}", "alice/conv", None)
    state.save_turn("alice/conv", IDS, 3, 1, None, None)


def _read_back(state) -> tuple:
    return (state.get_response("alice/resp_1", "conversation"), state.get_response("alice/resp_1", "response"),
            state.get_compaction("cmp_1"), state.load_turn("alice/conv"))


def _raw(stores, setting: str) -> bytes:
    """Every byte the store keeps of those records: the SQLite files (write-ahead log included), or the
    PostgreSQL columns as the server returns them."""
    if stores.kind == "sqlite":
        path = sqlite_state_path(setting)
        return b"".join(p.read_bytes() for p in Path(path).parent.iterdir() if p.name.startswith(path.name))
    import psycopg

    with psycopg.connect(setting, autocommit=True) as conn:
        rows = [*conn.execute("SELECT conversation, response FROM state_responses"),
                *conn.execute("SELECT summary FROM state_compactions"), *conn.execute("SELECT ids FROM state_turns")]
    return b"".join(bytes(v) for row in rows for v in row)


def test_records_read_back_whole_and_their_text_is_nowhere_in_the_store(stores, monkeypatch):
    monkeypatch.setenv(SECRET_ENV, "one secret")
    setting = stores.setting()
    writer, reader = stores.state(setting), stores.state(setting)  # two processes
    _fill(writer)
    conversation, response, summary, turn = _read_back(reader)
    assert TEXT in conversation and TEXT in response and summary == f"SUMMARY: {TEXT}"
    assert turn[0] == IDS and turn[1] == 3
    raw = _raw(stores, setting)
    assert raw  # the records are there, sealed
    assert MARKER.encode() not in raw and state_module.pack_ids(IDS) not in raw
    writer.close()
    reader.close()


def test_under_another_secret_they_read_as_unknown_said_once(stores, monkeypatch, caplog):
    monkeypatch.setenv(SECRET_ENV, "the first secret")
    setting = stores.setting()
    first = stores.state(setting)
    _fill(first)
    monkeypatch.setenv(SECRET_ENV, "another secret")
    other = stores.state(setting)
    caplog.set_level(logging.WARNING, logger="looptrace")
    assert _read_back(other) == (None, None, None, None)
    assert _read_back(other) == (None, None, None, None)
    said = [r for r in caplog.records if "another key secret" in r.getMessage()]
    assert len(said) == 1 and SECRET_ENV in said[0].getMessage() and MARKER not in caplog.text
    # Through the Responses store: the 404 of a response never stored, not a crash.
    responses = SharedResponseStore(other)
    with pytest.raises(APIError) as err:
        asyncio.run(responses.conversation("alice/resp_1"))
    assert err.value.status == 404
    responses.close()
    assert _read_back(first)[2] == f"SUMMARY: {TEXT}"  # the secret that wrote them still reads them
    first.close()
    other.close()


def test_a_record_moved_to_another_tenants_key_does_not_open(stores, monkeypatch):
    monkeypatch.setenv(SECRET_ENV, "one secret")
    setting = stores.setting()
    state = stores.state(setting)
    _fill(state)
    state._write([("UPDATE state_responses SET id = ? WHERE id = ?", ("mallory/resp_1", "alice/resp_1")),
                  ("UPDATE state_turns SET key = ? WHERE key = ?", ("mallory/conv", "alice/conv"))])
    assert state.get_response("mallory/resp_1", "conversation") is None
    assert state.load_turn("mallory/conv") is None
    # A response's two records swapped: neither opens as the other.
    state.put_response("alice/resp_2", '["c"]', '{"r": 1}', 10, max_responses=10, max_bytes=1 << 20)
    state._write([("UPDATE state_responses SET conversation = response WHERE id = ?", ("alice/resp_2",))])
    assert state.get_response("alice/resp_2", "conversation") is None
    assert state.get_response("alice/resp_2", "response") == '{"r": 1}'
    state.close()


def test_rows_written_before_sealing_still_read(stores, monkeypatch):
    monkeypatch.setenv(SECRET_ENV, "one secret")
    state = stores.state(stores.setting())
    state._write([
        ("INSERT INTO state_responses VALUES (?, ?, ?, ?, ?)",
         ("old", state_module.pack_json('["old items"]'), state_module.pack_json('{"id": "old"}'), 10, 1)),
        ("INSERT INTO state_turns (key, ids, prompt_length, encoding, label, digests, updated_ns) "
         "VALUES (?, ?, ?, ?, ?, ?, ?)", ("old-conv", state_module.pack_ids(IDS), 2, 0, None, None, 1))])
    assert state.get_response("old", "conversation") == '["old items"]'
    assert state.load_turn("old-conv")[0] == IDS
    state.save_turn("old-conv", IDS + [1], 2, 0, None, None)  # written again: sealed from now on
    (rows,) = state._read([("SELECT ids FROM state_turns WHERE key = ?", ("old-conv",))])
    assert is_sealed(rows[0][0]) and state.load_turn("old-conv")[0] == IDS + [1]
    state.close()


def test_each_record_gets_its_own_nonce():
    sealer = Sealer(b"secret")
    one, two = sealer.seal(b"same text", "t", "k"), sealer.seal(b"same text", "t", "k")
    assert one != two and sealer.open(one, "t", "k") == sealer.open(two, "t", "k") == b"same text"
    assert Sealer(b"secret").open(one, "t", "k") == b"same text"  # derived alike on every host
    assert Sealer(b"other").open(one, "t", "k") is None
