"""The digests a request's history is chained from (api/history_sessions.py): a unit of strings alone is
digested once per tenant, any other unit each time, and the chain is always the one its units' JSON
gives."""

from __future__ import annotations

from looptrace.proxy.api import history_sessions
from looptrace.proxy.api.history_sessions import HistorySessions, _chain, units

HISTORY = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "Fix it."},
           {"role": "assistant", "content": "", "tool_calls": [
               {"id": "call_1", "function": {"name": "read", "arguments": '{"n": 1}'}}]},
           {"role": "tool", "tool_call_id": "call_1", "content": "def main(): pass"}]


def expected_chain(messages: list[dict]) -> bytes:
    chain = b""
    for unit in (u for m in messages for u in units(m)):
        chain = _chain(chain, unit)
    return chain


def counting(monkeypatch) -> list:
    written: list = []
    canonical = history_sessions._canonical
    monkeypatch.setattr(history_sessions, "_canonical", lambda unit: written.append(unit) or canonical(unit))
    return written


def test_the_chain_is_the_units_json_and_plain_units_are_written_once(monkeypatch):
    more = [*HISTORY, {"role": "user", "content": "And the tests?"}]
    first, second = expected_chain(HISTORY), expected_chain(more)
    written = counting(monkeypatch)
    sessions = HistorySessions()
    assert sessions.join("t", HISTORY, "a").chain == first
    written.clear()
    assert sessions.join("t", [dict(m) for m in more], "b").chain == second
    # the call (its arguments an object) is written again; the strings-only units are not
    assert [u[0] for u in written if u[0] != "call"] == ["user"] and written[-1][1] == "And the tests?"
    assert sum(u[0] == "call" for u in written) == 1


def test_equal_numbers_of_other_types_are_not_one_unit():
    sessions = HistorySessions()
    one = [{"role": "user", "content": [{"type": "text", "text": "x", "n": 1}]}]
    true = [{"role": "user", "content": [{"type": "text", "text": "x", "n": True}]}]
    assert one == true
    assert sessions.join("t", one, "a").chain == expected_chain(one)
    assert sessions.join("t", true, "b").chain == expected_chain(true) != expected_chain(one)


def test_another_tenant_writes_its_own(monkeypatch):
    expected = expected_chain(HISTORY)
    written = counting(monkeypatch)
    sessions = HistorySessions()
    sessions.join("t", HISTORY, "a")
    written.clear()
    assert sessions.join("u", HISTORY, "b").chain == expected
    assert len(written) == len([u for m in HISTORY for u in units(m)])


def test_what_is_kept_stays_within_its_bytes(monkeypatch):
    monkeypatch.setattr(history_sessions, "MAX_UNIT_BYTES", 400)
    long = [{"role": "user", "content": "y" * 200}]
    expected = expected_chain(long)
    written = counting(monkeypatch)
    sessions = HistorySessions()
    sessions.join("t", long, "a")  # too big to keep
    written.clear()
    assert sessions.join("t", long, "b").chain == expected
    assert len(written) == 1
    assert sessions._units._kept.bytes <= 400
