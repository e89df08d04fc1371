"""The store's writer and the queue in front of it: batches written whole and in few statements,
a queue bounded by spans and by bytes, and traces that lost spans marked incomplete; on SQLite and on
PostgreSQL alike (the `stores` fixture runs each test on both)."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult

from looptrace.trace_store.processor import QueueingSpanProcessor
from looptrace.trace_store.sqlite.schema import VERSION
from looptrace.trace_store.sqlite.store import SQLiteTraceStore

from .test_tracing import ANSWER, ASK, CALL, SESSION, WEATHER, App, run, settings_for
from waiting import wait_until


@pytest.fixture(scope="module")
def agent_spans(qwen3_5_dir, tmp_path_factory):
    """The spans of real requests, in the order they ended: two agent sessions of a tool call and the
    answer to its result, and a request of no session."""
    tmp_path = tmp_path_factory.mktemp("agent")

    async def sessions():
        async with App(settings_for(qwen3_5_dir, tmp_path, [CALL, ANSWER, CALL, ANSWER, ANSWER])) as app:
            for session in ("agent-a", "agent-b"):
                headers = {**SESSION, "session_id": session}
                status, first = await app.chat(headers=headers, messages=ASK, tools=[WEATHER])
                assert status == 200
                call = first["choices"][0]["message"]["tool_calls"][0]
                history = ASK + [{"role": "assistant", "content": None, "tool_calls": [call]},
                                 {"role": "tool", "tool_call_id": call["id"], "content": f"sunny for {session}"}]
                assert (await app.chat(headers=headers, messages=history, tools=[WEATHER]))[0] == 200
            assert (await app.chat(messages=ASK))[0] == 200
            return app.spans.get_finished_spans()

    return run(sessions())


def test_one_batch_stores_what_span_by_span_does(agent_spans, stores):
    one_by_one = stores.make()
    for span in agent_spans:
        assert one_by_one.export([span]) is SpanExportResult.SUCCESS
    together = stores.make()
    assert together.export(list(agent_spans)) is SpanExportResult.SUCCESS
    expected = stores.contents(one_by_one)
    assert stores.contents(together) == expected
    # And what that is: five requests, both sessions of two steps, each call joined by its result.
    assert len(expected["traces"]) == 5 and len(expected["tool_calls"]) == 2
    sessions = {row[0]: row for row in expected["sessions"]}
    assert sessions["agent-a"][7] == sessions["agent-b"][7] == 2  # steps
    for session in ("agent-a", "agent-b"):
        (call,) = together.session(session)["steps"][0]["tool_calls"]
        assert call["outcome"] == "valid" and call["name"] == "get_weather"
        trace = together.get_trace(together.session(session)["steps"][0]["trace_id"])
        (span,) = [s for s in trace["spans"] if s["name"].startswith("execute_tool")]
        assert span["attributes"]["looptrace.tool.result"] == f"sunny for {session}"
        assert span["attributes"]["looptrace.tool.result_trace_id"] == together.session(session)["steps"][1]["trace_id"]


def test_a_batch_is_a_few_statements_not_one_per_span(agent_spans, stores, monkeypatch):
    # Every statement hands the GIL to the event loop and must win it back (batch.py), and on
    # PostgreSQL is a round trip: their number must not grow with the batch.
    store = stores.make()
    statements: list[str] = []
    if stores.kind == "sqlite":
        store._writer().set_trace_callback(statements.append)
    else:
        import psycopg

        execute = psycopg.Cursor.execute
        monkeypatch.setattr(psycopg.Cursor, "execute",
                            lambda self, query, *a, **k: statements.append(str(query)) or execute(self, query, *a, **k))
    store._last_retention = time.monotonic()  # retention's own statements, once a minute, are not the batch's
    many = list(agent_spans) * 20  # a hundred requests (the same ids again: replaced, not added)
    assert store.export(many) is SpanExportResult.SUCCESS
    # (Lines starting "--" are SQLite's own statements inside one of ours: FTS5's, no GIL involved.)
    writes = [s for s in statements if not s.startswith(("BEGIN", "COMMIT", "--"))]
    assert len(many) >= 400 and len(writes) <= 12, "\n".join(w[:50] for w in writes)  # a few per table
    assert len(store.list_traces(limit=1000)["data"]) == 5


class HeldExporter:
    """The real store, held shut until released: lets a test fill the queue in front of it."""

    def __init__(self, store) -> None:
        self.store, self.open = store, threading.Event()

    def export(self, spans):
        self.open.wait(30)
        return self.store.export(spans)

    def shutdown(self):
        self.store.shutdown()


def processor_for(stores, **bounds):
    store = stores.make()
    held = HeldExporter(store)
    dropped = []
    processor = QueueingSpanProcessor(held, name="sqlite", on_dropped=lambda _, n: dropped.append(n),
                                      on_lost=store.note_lost, **bounds)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    return store, held, processor, dropped, provider.get_tracer("test")


def one_request(tracer, prompt: str = "hello") -> str:
    root = tracer.start_span("chat m", attributes={"looptrace.endpoint": "chat", "gen_ai.request.model": "m",
                                                   "gen_ai.conversation.id": "c"})
    child = tracer.start_span("render", context=_context(root), attributes={"looptrace.prompt.text": prompt})
    child.end()
    root.end()
    return format(root.get_span_context().trace_id, "032x")


def _context(span):
    from opentelemetry import trace

    return trace.set_span_in_context(span)


def hold(processor, tracer) -> None:
    """One lone span, taken by the exporting thread, which then waits at the held store: what
    follows stays in the queue."""
    tracer.start_span("held").end()
    wait_until(lambda: not processor.depth, 5, every=0.01, what="the span taken by the exporting thread")


def test_the_queue_is_bounded_by_bytes_and_a_trace_that_lost_a_span_says_so(stores):
    store, held, processor, dropped, tracer = processor_for(stores, max_bytes=200_000)
    hold(processor, tracer)
    assert processor.held_bytes == 0
    whole = one_request(tracer, "x" * 100_000)
    assert processor.depth == 2 and 100_000 < processor.held_bytes < 200_000
    cut = one_request(tracer, "y" * 150_000)  # its render span does not fit beside the queued prompt
    assert sum(dropped) == 1 and processor.depth == 3 and processor.held_bytes < 200_000
    held.open.set()
    assert processor.force_flush(10_000)
    assert processor.held_bytes == 0
    assert store.get_trace(whole)["complete"]
    lost = store.get_trace(cut)
    assert lost["complete"] is False and lost["lost_spans"] == 1
    assert [s["name"] for s in lost["spans"]] == ["chat m"]  # the server span, which did fit
    listed = {t["trace_id"]: t for t in store.list_traces()["data"]}
    assert listed[cut]["complete"] is False and listed[cut]["lost_spans"] == 1
    assert listed[whole]["complete"] and "lost_spans" not in listed[whole]
    steps = {s["trace_id"]: s for s in store.session("c")["steps"]}
    assert steps[cut]["lost_spans"] == 1 and "lost_spans" not in steps[whole]
    # A span larger than the whole bound is refused even by an empty queue; with nothing after it to
    # carry the mark, the mark is stored by itself, and a flush waits for it.
    alone = tracer.start_span("chat m", attributes={"looptrace.endpoint": "chat", "big": "z" * 250_000})
    alone.end()
    assert processor.force_flush(10_000) and sum(dropped) == 2
    trace_id = format(alone.get_span_context().trace_id, "032x")
    assert store.get_trace(trace_id) == {"trace_id": trace_id, "complete": False, "spans": [], "lost_spans": 1}
    processor.shutdown()


def test_the_queue_is_bounded_by_spans(stores):
    store, held, processor, dropped, tracer = processor_for(stores, max_queue=3)
    hold(processor, tracer)
    whole = one_request(tracer)
    cut = one_request(tracer)  # its render span is the third; its server span finds the queue full
    assert sum(dropped) == 1 and processor.depth == 3
    held.open.set()
    assert processor.force_flush(10_000)
    assert store.get_trace(whole)["complete"]
    # No server span: nothing to list, but reading the trace says what happened to it.
    lost = store.get_trace(cut)
    assert (lost["complete"], lost["lost_spans"], [s["name"] for s in lost["spans"]]) == (False, 1, ["render"])
    assert cut not in {t["trace_id"] for t in store.list_traces()["data"]}
    processor.shutdown()


def test_a_failed_batch_marks_its_traces_once_the_store_writes_again(stores, monkeypatch):
    # A batch the store refuses (a disk error in SQLite, bad data in PostgreSQL) is dropped and
    # counted; one PostgreSQL cannot take for now is held instead (tests/integration/test_shared_store.py, the outage).
    store = stores.make()
    dropped = []
    processor = QueueingSpanProcessor(store, name="sqlite", on_dropped=lambda _, n: dropped.append(n),
                                      on_lost=store.note_lost)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("test")
    real_writer = store._writer

    def broken():
        if stores.kind == "sqlite":
            raise sqlite3.OperationalError("disk I/O error")
        import psycopg

        raise psycopg.DataError("invalid byte sequence")

    monkeypatch.setattr(store, "_writer", broken)
    failed = one_request(tracer)
    assert processor.force_flush(10_000) and sum(dropped) == 2
    monkeypatch.setattr(store, "_writer", real_writer)
    written = one_request(tracer)
    assert processor.force_flush(10_000)
    assert store.get_trace(written)["complete"]
    assert store.get_trace(failed) == {"trace_id": failed, "complete": False, "spans": [], "lost_spans": 2}
    processor.shutdown()


def test_retention_removes_what_is_left_of_a_trace_that_lost_its_server_span(stores):
    store = stores.make(retention_seconds=3600)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(store))
    tracer = provider.get_tracer("test")
    orphan = tracer.start_span("render")
    orphan.end()
    trace_id = orphan.get_span_context().trace_id
    store.note_lost({trace_id: 1})
    assert store.export([]) is SpanExportResult.SUCCESS  # the mark goes in with the next batch
    assert store.get_trace(format(trace_id, "032x"))["lost_spans"] == 1
    stores.sql(store, "UPDATE lost_spans SET noted_ns = noted_ns - ?", (7200 * 10**9,))
    store.enforce_retention()
    assert store.get_trace(format(trace_id, "032x")) is None


def test_traces_page_by_cursor(stores):
    store = stores.make()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(store))
    tracer = provider.get_tracer("test")
    start = time.time_ns()
    made = []
    for i in range(23):
        # Pairs share a start time: the cursor must still neither skip nor repeat one.
        root = tracer.start_span("chat m", start_time=start - (i // 2) * 1000,
                                 attributes={"looptrace.endpoint": "chat"})
        root.end(end_time=start + 1)
        made.append(format(root.get_span_context().trace_id, "032x"))
    seen, before = [], None
    while True:
        page = store.list_traces(limit=5, before=before)
        seen += [t["trace_id"] for t in page["data"]]
        if not page["next"]:
            break
        stamp, _, key = page["next"].partition(":")
        before = (int(stamp), key)
    assert sorted(seen) == sorted(made) and len(seen) == 23
    assert seen == [t["trace_id"] for t in store.list_traces(limit=100)["data"]]


def test_a_version_2_store_opens_and_gains_its_lost_spans_table(tmp_path):
    path = tmp_path / "v2.sqlite3"
    store = SQLiteTraceStore(path)
    store.open()
    store.shutdown()
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE lost_spans")
        db.execute("PRAGMA user_version = 2")
    reopened = SQLiteTraceStore(path)
    reopened.open()
    assert reopened.list_traces()["data"] == []
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == VERSION
        assert db.execute("SELECT count(*) FROM lost_spans").fetchone()[0] == 0


def test_retention_between_batches_deletes_a_little_at_a_time(stores, monkeypatch):
    # A big deletion in one go would hold the writer while spans queue up (a tenth of a 1 GB store
    # took seconds): after a batch, retention deletes at most RETIRE_PER_BATCH traces.
    from looptrace.trace_store.postgres import store as postgres
    from looptrace.trace_store.sqlite import store as sqlite

    monkeypatch.setattr(sqlite if stores.kind == "sqlite" else postgres, "RETIRE_PER_BATCH", 2)
    store = stores.make(retention_seconds=3600)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(store))
    tracer = provider.get_tracer("test")
    old = time.time_ns() - 2 * 3600 * 10**9
    store._last_retention = time.monotonic()  # not due while the old traces are written
    for i in range(5):
        tracer.start_span("chat m", start_time=old + i, attributes={"looptrace.endpoint": "chat"}).end(end_time=old + i)
    store._last_retention = 0.0  # due now
    left = []
    for _ in range(4):
        tracer.start_span("chat m", attributes={"looptrace.endpoint": "chat"}).end()  # a batch: then retention
        left.append(sum(1 for t in store.list_traces()["data"] if t["start_time_unix_nano"] < old + 10))
    assert left == [3, 1, 0, 0]
    assert not store._retiring


def test_text_no_store_can_hold_fails_no_batch(stores):
    # A client's model name or conversation with a lone surrogate or NUL once failed the whole batch
    # it was in (every request's spans in it), in SQLite; PostgreSQL's text holds neither either.
    store = stores.make()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(store))
    tracer = provider.get_tracer("test")
    tracer.start_span("chat \ud800", attributes={"looptrace.endpoint": "chat", "gen_ai.request.model": "\ud800x",
                                                  "gen_ai.conversation.id": "c\x00d"}).end()
    (row,) = store.list_traces()["data"]
    assert (row["model"], row["conversation"]) == ("\ufffdx", "c\ufffdd")
    assert store.session("c\x00d")["steps"][0]["trace_id"] == row["trace_id"]  # looked for as it was stored


def _old_trace(store: SQLiteTraceStore) -> str:
    """One request's trace, stored two hours ago: retention's to delete."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(store))
    old = time.time_ns() - 2 * 3600 * 10**9
    span = provider.get_tracer("test").start_span("chat m", start_time=old, attributes={"looptrace.endpoint": "chat"})
    span.end(end_time=old)
    return format(span.get_span_context().trace_id, "032x")


def test_retention_waits_for_another_writer_on_the_file(tmp_path):
    # A replay writes its spans into the serving process's file. SQLite cannot wait for another writer
    # once a transaction has read (it fails at once: "database is locked"), and retention reads which
    # traces to delete before it deletes them: it must take the write lock first.
    store = SQLiteTraceStore(tmp_path / "traces.sqlite3", retention_seconds=3600)
    store._last_retention = time.monotonic()  # not due while the old trace is written
    trace_id = _old_trace(store)
    other = sqlite3.connect(store.path, check_same_thread=False, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    other.execute("INSERT INTO lost_spans VALUES ('f' || hex(randomblob(15)), 1, 0)")
    release = threading.Timer(0.3, lambda: other.execute("COMMIT"))
    release.start()
    try:
        store.enforce_retention()  # meets the other writer's lock and waits for it
    finally:
        release.join()
        other.close()
    assert store.get_trace(trace_id) is None
    store.shutdown()


def test_a_batch_is_stored_even_when_retention_after_it_fails(tmp_path, monkeypatch):
    store = SQLiteTraceStore(tmp_path / "traces.sqlite3", retention_seconds=3600)

    def locked(limit):
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(store, "_retire", locked)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(store))
    span = provider.get_tracer("test").start_span("chat m", attributes={"looptrace.endpoint": "chat"})
    span.end()
    assert store.export([span]) is SpanExportResult.SUCCESS  # stored; retention tries again later
    assert store.get_trace(format(span.get_span_context().trace_id, "032x"))["complete"]
    store.shutdown()
