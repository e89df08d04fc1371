"""State any process can serve a turn from (trace_store/state.py, proxy/engine/memory.py,
proxy/observe/conversations.py, api/openai/responses/store.py): what one process leaves of a conversation, another
reads; bounded as the in-memory versions are; and while the store does not answer, each process serves
from its memory and nothing fails. Two objects on one store stand for two processes; on SQLite and
PostgreSQL alike."""

from __future__ import annotations

import asyncio
import time

import pytest
from opentelemetry.trace import SpanContext, TraceFlags

from looptrace.proxy.api.errors import APIError
from looptrace.proxy.api.openai.responses.store import SharedResponseStore
from looptrace.proxy.engine import state_calls
from looptrace.proxy.engine.memory import Memory, StoredMemory
from looptrace.proxy.engine.turn_digests import TurnDigests
from looptrace.proxy.observe.conversations import Conversations, StoredConversations
from looptrace.trace_store import state as state_module

from .test_responses_request import bounded_by_bytes, newest_conversations_only, user
from stores import SilentState as Silent

CALL = SpanContext(0x1234, 0x5678, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
FIRST = ['{"role":"system"}', '{"role":"user","n":1}']
SECOND = FIRST + ['{"role":"assistant","n":1}', '{"role":"tool","n":1}']
DIGESTS = TurnDigests([11, -12], 13, (14, 15, -16))


def two_processes(stores):
    setting = stores.setting()
    return StoredConversations(stores.state(setting)), StoredConversations(stores.state(setting))


def one_turn(conversations, messages: list[str], call: str | None = None, results: list[str] = (),
             trace_id: str | None = None) -> tuple[int, dict]:
    turn = conversations.begin("agent-1")
    turn.trace_id = trace_id
    taken = turn.take_results(list(results))
    new_from, _ = turn.new_messages_from(messages)
    if call:
        turn.expect_result(call, CALL, "read_file")
    turn.finish()
    return new_from, taken


def remembered(memory, ids: list[int], prompt_length: int, label: str | None = None,
               digests: TurnDigests | None = DIGESTS) -> list[int] | None:
    """One turn through a conversation's memory, as a Generation makes it: what the last turn left
    (its ids), then this turn kept."""
    recall = memory.recall("agent-1", label)
    last = recall.last()
    recall.keep(ids, prompt_length, len(ids), digests)
    return last.ids if last is not None else None


def test_a_turn_finds_the_trace_its_conversation_continues(stores):
    """The next turn stores its messages as what they add to the last turn's trace (trace_store/chains.py):
    that trace comes back, on another process; a request that failed leaves its messages' trace."""
    a, b = two_processes(stores)
    try:
        one_turn(a, FIRST, trace_id="a" * 32)
        turn = b.begin("agent-1")
        assert turn.new_messages_from(SECOND) == (2, "a" * 32)
        turn.trace_id = "b" * 32
        turn.end()  # failed: its digests are kept, with its trace
        assert a.begin("agent-1").new_messages_from(SECOND) == (4, "b" * 32)
    finally:
        a.close()
        b.close()


def test_the_engines_memory_of_a_turn_is_read_whole_on_another_process(stores):
    """What a conversation's model read and sampled, and what its turn was asked and answered: the next
    turn continues it (token continuity, the prompt stored as what it adds) on any process."""
    setting = stores.setting()
    a, b = StoredMemory(stores.state(setting)), StoredMemory(stores.state(setting))
    try:
        assert remembered(a, [1, 2, 3, 4], 3, label="a" * 32) is None
        last = b.recall("agent-1").last()
        assert (last.prompt, last.sampled, last.encoding, last.label, last.digests) == (
            [1, 2, 3], [4], 4, "a" * 32, DIGESTS)
        assert remembered(b, [1, 2, 3, 4, 5, 6], 5, digests=None) == [1, 2, 3, 4]
        last = a.recall("agent-1").last()
        assert (last.ids, last.prompt_length, last.label, last.digests) == ([1, 2, 3, 4, 5, 6], 5, None, None)
    finally:
        a.close()
        b.close()


def test_a_turn_on_one_process_continues_on_another(stores):
    a, b = two_processes(stores)
    try:
        assert one_turn(a, FIRST, call="call_1") == (0, {})
        new_from, taken = one_turn(b, SECOND, results=["call_1", "call_unknown"])
        assert new_from == 2  # what is new, found on the other process
        ((context, name),) = taken.values()
        assert (list(taken), context.trace_id, context.span_id, name) == (["call_1"], 0x1234, 0x5678, "read_file")
        # A result is taken once: the next turn, back on the first process, finds it gone.
        assert one_turn(a, SECOND + ['{"role":"user","n":2}'], results=["call_1"]) == (4, {})
    finally:
        a.close()
        b.close()


def test_a_request_without_a_conversation_still_links_its_results(stores):
    a, b = two_processes(stores)
    try:
        turn = a.begin(None)
        turn.expect_result("call_9", CALL, "grep")
        turn.finish()
        turn = b.begin(None)
        assert list(turn.take_results(["call_9"])) == ["call_9"]
        turn.end()
        assert b.begin(None).take_results(["call_9"]) == {}
    finally:
        a.close()
        b.close()


def test_keys_a_client_sent_are_kept_as_text_the_store_holds(stores):
    # A conversation id from a header (aiohttp keeps undecodable bytes as lone surrogates), a tool
    # call's id from a message: one the store could not bind would fail it for every request.
    state = stores.state(stores.setting())
    try:
        state.save("c\udcff\x00", digests=[2], expected={}, taken=["call\ud800"])
        assert state.load("c\udcff\x00")[0] == [2]
        state.save_turn("c\udcff\x00", [1], 1, 0, "l\ud800", None)
        assert state.load_turn("c\udcff\x00")[:2] == ([1], 1)
        assert state.calls(["call\x00"]) == {} and state.get_response("resp_\ud800", "response") is None
    finally:
        state.close()


def test_the_state_is_bounded_as_in_memory(stores, monkeypatch):
    monkeypatch.setattr(state_module, "MAX_CONVERSATIONS", 3)
    monkeypatch.setattr(state_module, "MAX_CALLS", 4)
    monkeypatch.setattr(state_module, "PRUNE_EVERY", 1)
    state = stores.state(stores.setting())
    try:
        for i in range(10):
            state.save(f"c{i}", digests=[i], expected={f"call{i}": ("a" * 32, "b" * 16, "t")}, taken=[])
            state.save_turn(f"c{i}", [i], 1, 0, None, None)
        assert [state.load(f"c{i}")[0] for i in range(10)] == [None] * 7 + [[7], [8], [9]]
        assert [(state.load_turn(f"c{i}") or [None])[0] for i in range(10)] == [None] * 7 + [[7], [8], [9]]
        assert list(state.calls([f"call{i}" for i in range(10)])) == [f"call{i}" for i in range(6, 10)]
    finally:
        state.close()


def test_the_hot_read_is_one_query_of_packed_ids(stores):
    """A conversation's last prompt and answer, 32,768 tokens: 128 KiB, read whole."""
    state = stores.state(stores.setting())
    try:
        ids = list(range(100_000, 132_768))
        state.save_turn("long", ids, 32_000, 7, None, b"\x01" * 800)
        started = time.perf_counter()
        assert state.load_turn("long") == (ids, 32_000, 7, None, b"\x01" * 800)
        assert time.perf_counter() - started < 1.0  # milliseconds here (bench/tracing.py state measures it)
    finally:
        state.close()


@pytest.mark.parametrize("hang", [False, True], ids=["refused", "frozen"])
def test_while_the_store_does_not_answer_memory_serves_and_nothing_fails(monkeypatch, caplog, hang):
    monkeypatch.setattr(state_calls, "WAIT", 0.3)
    conversations, memory = StoredConversations(Silent(hang)), StoredMemory(Silent(hang))
    try:
        started = time.monotonic()
        assert one_turn(conversations, FIRST, call="call_1") == (0, {})
        assert remembered(memory, [1, 2], 1) is None
        new_from, taken = one_turn(conversations, SECOND, results=["call_1"])
        assert (new_from, list(taken)) == (2, ["call_1"])  # as Conversations would
        assert remembered(memory, [1, 2, 3], 2) == [1, 2]  # as Memory would
        assert time.monotonic() - started < 5  # a deadline, then the store is left alone a while
        assert caplog.text.count("does not answer") == 2  # once for each
    finally:
        conversations.close()
        memory.close()


def test_memory_alone_is_what_it_was():
    conversations, memory = Conversations(), Memory()
    assert one_turn(conversations, FIRST, call="call_1") == (0, {})
    assert remembered(memory, [1, 2], 1) is None
    new_from, taken = one_turn(conversations, SECOND, results=["call_1", "call_1"])
    assert (new_from, list(taken)) == (2, ["call_1"])
    assert remembered(memory, [1, 2, 3], 2) == [1, 2]


# -- stored responses --

def test_shared_responses_keep_the_in_memory_bounds(stores):
    asyncio.run(newest_conversations_only(SharedResponseStore(stores.state(stores.setting()), max_responses=2)))
    store = SharedResponseStore(stores.state(stores.setting()), max_responses=256, max_bytes=5 << 20)
    asyncio.run(bounded_by_bytes(store))
    count, size = store.state.count_responses()
    assert count == 3 and size <= 5 << 20  # four minus the one deleted, in the store as in memory


def test_a_response_stored_by_one_process_is_continued_and_deleted_by_another(stores):
    setting = stores.setting()
    a, b = SharedResponseStore(stores.state(setting)), SharedResponseStore(stores.state(setting))
    reply = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "4"}]}

    async def run():
        await a.put({"id": "resp_1", "output": [reply]}, [user("2+2?")])
        assert await b.conversation("resp_1") == [user("2+2?"), reply]
        assert (await b.response("resp_1"))["id"] == "resp_1"
        await b.delete("resp_1")
        for read in (a.response, a.conversation):  # gone for the process that stored it too
            with pytest.raises(APIError) as info:
                await read("resp_1")
            assert info.value.status == 404

    asyncio.run(run())


def test_responses_while_the_store_does_not_answer(monkeypatch):
    from looptrace.proxy.api.openai.responses import store as response_store

    monkeypatch.setattr(response_store, "WAIT", 0.5)
    store = SharedResponseStore(Silent(False))

    async def run():
        await store.put({"id": "resp_here", "output": []}, [user("hi")])  # kept here, said in the log
        assert await store.conversation("resp_here") == [user("hi")]
        with pytest.raises(APIError) as info:
            await store.conversation("resp_elsewhere")
        assert (info.value.status, info.value.code) == (503, "response_store_unavailable")
        assert "postgresql://nowhere/x" in info.value.message and "connection refused" in info.value.message

    asyncio.run(run())
