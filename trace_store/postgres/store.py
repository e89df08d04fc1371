"""The trace store in PostgreSQL: the same store as SQLite's, shared by every looptrace process that
names it (`--trace-db postgresql://…`), written in batches off the event loop.

`export` runs on the exporting thread only (it owns the writing connection); reading is queries.py's,
on a small pool of connections of its own. While the server cannot be reached (stopped, restarting,
the network down) the batch in hand is held and tried again, with a growing pause, until it is
written or the process stops: the spans behind it wait in the processor's bounded queue, and what
does not fit there is dropped, counted and marked lost (processor.py), as on SQLite. A batch the
server refuses (bad data) is dropped and counted at once. Retention by age and by size runs between
batches, a slice at a time, in one process at a time (an advisory lock).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Callable, Sequence

import psycopg
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from ..batch import Batch, hex_id
from .. import erasure
from ..chains import materialize
from ..steps import StepGatherer
from . import write as pg_write
from .connections import _Reading, connect, row_factory
from .queries import PostgresQueries
from .schema import LOCK, prepare

log = logging.getLogger("looptrace.trace")

MAX_PENDING_LOST = 100_000  # traces waiting to be marked incomplete while the store cannot write
RETENTION_INTERVAL = 5.0  # seconds between looks at age and size
RETIRE_PER_BATCH = 2000  # traces retention deletes after a batch, at most
RETRY_PAUSES = (0.2, 0.5, 1.0, 2.0)  # between attempts at a held batch, then the last again


class PostgresTraceStore(PostgresQueries, SpanExporter):
    sink = "postgresql"  # its queue's name in the metrics

    def __init__(self, url: str, *, retention_seconds: float = 7 * 86400, max_bytes: int = 1 << 30,
                 on_written: Callable[[list[dict]], None] | None = None) -> None:
        super().__init__(url)
        self.retention_seconds = retention_seconds
        self.max_bytes = max_bytes
        self.on_written = on_written  # called on the writing thread with each batch's stored steps
        self._db: psycopg.Connection | None = None
        self._prepared = False
        self._last_retention = 0.0
        self._retiring = False
        self._steps = StepGatherer()
        self._lost: dict[str, int] = {}
        self._writer_id = random.getrandbits(62)  # this process's row of store_usage
        self._closing = threading.Event()

    # -- writing (the exporting thread) --

    def _writer(self) -> psycopg.Connection:
        if self._db is None or self._db.closed:
            db = connect(self.url, row_factory=row_factory)
            # Spans are a record, not a ledger: a commit need not wait for the disk (a crash of the
            # server loses its last moments of traces, never their consistency).
            db.execute("SET synchronous_commit = off")
            db.execute("SET statement_timeout = 60000")
            db.commit()
            if not self._prepared:
                prepare(db)
                self._prepared = True
            self._db = db
        return self._db

    def open(self) -> None:
        """Creates or upgrades the tables now, so readers find them; a server that cannot be reached
        is logged and tried again with the first batch. Never raises."""
        try:
            self._writer()
        except psycopg.Error as exc:
            log.warning("trace store %s: %s; spans will wait for it", self.where, str(exc).strip())
            self._close_writer()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        batch = Batch(self._steps)
        for span in spans:
            batch.add(span)
        attempt = 0
        while True:
            try:
                self._write(batch)
                break
            except psycopg.OperationalError as exc:  # unreachable, restarting, a deadlock: try again
                self._close_writer()
                if self._closing.is_set():
                    log.warning("trace store %s: %s; %d spans not written", self.where, str(exc).strip(), len(spans))
                    return SpanExportResult.FAILURE
                if attempt == 0:
                    log.warning("trace store %s: %s; holding %d spans until it answers", self.where,
                                str(exc).strip(), len(spans))
                self._closing.wait(RETRY_PAUSES[min(attempt, len(RETRY_PAUSES) - 1)])
                attempt += 1
            except psycopg.Error as exc:
                log.warning("trace store %s refused a batch: %s", self.where, str(exc).strip())
                self._close_writer()
                return SpanExportResult.FAILURE
        if attempt:
            log.info("trace store %s answers again: the held spans are written", self.where)
        self._after(batch)
        return SpanExportResult.SUCCESS

    def _write(self, batch: Batch) -> None:
        db = self._writer()
        with db.transaction(), db.cursor() as cur:
            pg_write.write(cur, batch, self._writer_id)
            if self._lost:
                pg_write.write_lost(cur, self._lost, time.time_ns())
        self._lost = {}  # only once written: a failed batch keeps them for the next

    def _after(self, batch: Batch) -> None:
        try:
            if self._retiring or time.monotonic() - self._last_retention > RETENTION_INTERVAL:
                self._retiring = not self._retire(RETIRE_PER_BATCH)
                self._last_retention = time.monotonic()
        except psycopg.Error as exc:  # the batch is written; retention tries again next time
            log.warning("trace store %s: retention: %s", self.where, str(exc).strip())
            self._close_writer()
        if batch.stored and self.on_written is not None:
            try:
                self.on_written(batch.stored)
            except Exception:  # noqa: BLE001 - a listener's failure is not the store's
                log.exception("trace store listener failed")

    def note_lost(self, lost: dict[int, int]) -> None:
        """Traces that lost spans before reaching the store: marked with the next batch written."""
        for trace_id, count in lost.items():
            key = hex_id(trace_id, 32)
            if key in self._lost or len(self._lost) < MAX_PENDING_LOST:
                self._lost[key] = self._lost.get(key, 0) + count

    def _close_writer(self) -> None:
        if self._db is not None:
            try:
                self._db.close()
            except psycopg.Error:
                pass
            self._db = None

    # -- retention --

    def enforce_retention(self) -> None:
        """All of retention, now."""
        while not self._retire(None):
            pass

    def _retire(self, limit: int | None) -> bool:
        """As SQLite's (sqlite/store.py): up to `limit` traces past their age, else the oldest while the
        stored rows' bytes are past the size; True once nothing is left to delete."""
        db = self._writer()
        cutoff = time.time_ns() - int(self.retention_seconds * 1e9)
        with db.transaction():
            if not db.execute("SELECT pg_try_advisory_xact_lock(%s)", (LOCK + 1,)).fetchone()[0]:
                return True  # another process is retiring
            deleted = self._delete(db, "SELECT trace_id FROM traces WHERE start_ns < %s ORDER BY start_ns LIMIT %s",
                                   (cutoff, limit))
            deleted += self._delete(db, "SELECT trace_id FROM lost_spans WHERE noted_ns < %s LIMIT %s", (cutoff, limit))
        if limit is not None and deleted >= limit:
            return False
        used = db.execute("SELECT coalesce(sum(bytes), 0) FROM store_usage").fetchone()[0]
        db.commit()
        if used <= self.max_bytes:
            return True
        with db.transaction():
            total = db.execute("SELECT count(*) FROM traces").fetchone()[0]
            if total:
                chunk = max(1, total // 10)  # the oldest tenth at a time, until what is left fits
                self._delete(db, "SELECT trace_id FROM traces ORDER BY start_ns LIMIT %s",
                             (chunk if limit is None else min(chunk, limit),))
        return not total

    def _delete(self, db: psycopg.Connection, select: str, args: tuple) -> int:
        """The traces `select` picks, every row of theirs, a statement per table; their bytes leave
        the usage count."""
        db.execute("CREATE TEMP TABLE IF NOT EXISTS doomed (trace_id text PRIMARY KEY) ON COMMIT DELETE ROWS")
        db.execute("DELETE FROM doomed")
        count = db.execute(f"INSERT INTO doomed {select} ON CONFLICT DO NOTHING", args).rowcount
        if not count:
            return 0
        self._materialize(db)
        found = erasure.linked(_Reading(db), "postgresql")  # what the state beside the traces holds of them
        sessions = found.sessions
        for table in ("spans", "traces"):
            db.execute(f"WITH gone AS (DELETE FROM {table} WHERE trace_id IN (SELECT trace_id FROM doomed) "
                       "RETURNING bytes) INSERT INTO store_usage SELECT %s, -coalesce(sum(bytes), 0) FROM gone "
                       "ON CONFLICT (writer) DO UPDATE SET bytes = store_usage.bytes + excluded.bytes",
                       (self._writer_id,))
        for table in ("tool_calls", "trace_text", "lost_spans", "trace_bases"):
            db.execute(f"DELETE FROM {table} WHERE trace_id IN (SELECT trace_id FROM doomed)")
        for start in range(0, len(sessions), 500):
            rebuild_sessions(db, sessions[start:start + 500])
        erasure.gone(_Reading(db), found)
        for _, sql, args in erasure.state_statements(found):  # conversations and rollouts none of whose traces is left
            _Reading(db).execute(sql, args)
        return count

    def _materialize(self, db: psycopg.Connection) -> None:
        """The steps left that build on the doomed ones, whole first (chains.py), their bytes counted."""
        grown = 0

        def update(trace_id: str, span_id: str, attributes: str, old: str) -> None:
            nonlocal grown
            grown += len(attributes) - len(old)
            db.execute("UPDATE spans SET attributes = %s, bytes = bytes + %s WHERE trace_id = %s AND span_id = %s",
                       (attributes, len(attributes) - len(old), trace_id, span_id))

        if materialize(_Reading(db), "doomed", update) and grown:
            db.execute("INSERT INTO store_usage VALUES (%s, %s) ON CONFLICT (writer) DO UPDATE "
                       "SET bytes = store_usage.bytes + excluded.bytes", (self._writer_id, grown))

    def erase(self, subject) -> "erasure.Found":
        """Every trace of `subject` (trace_store/erasure.py), its rows in every table, on a connection of
        its own (the exporting thread keeps the writer's); the rows' space is PostgreSQL's VACUUM's to free."""
        with connect(self.url, row_factory=row_factory) as db, db.transaction():
            db.execute("CREATE TEMP TABLE IF NOT EXISTS doomed (trace_id text PRIMARY KEY) ON COMMIT DELETE ROWS")
            reading = _Reading(db)
            erasure.pick(reading, subject)
            keyed = erasure.by_key(reading, subject)
            if subject.kind == "before":
                self._materialize(db)
            found = erasure.linked(reading, "postgresql")
            before = db.execute("SELECT count(*) FROM sessions").fetchone()[0]
            found.counts["spans"] = db.execute("SELECT count(*) FROM spans WHERE trace_id IN "
                                               "(SELECT trace_id FROM doomed)").fetchone()[0]
            for table in ("spans", "traces"):  # their bytes out of the usage retention keeps under --trace-max-mb
                db.execute(f"WITH gone AS (DELETE FROM {table} WHERE trace_id IN (SELECT trace_id FROM doomed) "
                           "RETURNING bytes) INSERT INTO store_usage SELECT %s, -coalesce(sum(bytes), 0) FROM gone "
                           "ON CONFLICT (writer) DO UPDATE SET bytes = store_usage.bytes + excluded.bytes",
                           (self._writer_id,))
            for table in ("tool_calls", "trace_text", "lost_spans", "trace_bases"):
                found.counts[table] = db.execute(
                    f"DELETE FROM {table} WHERE trace_id IN (SELECT trace_id FROM doomed)").rowcount
            found.counts["traces"] = len(found.traces)
            for start in range(0, len(found.sessions), 500):
                rebuild_sessions(db, found.sessions[start:start + 500])
            if keyed:
                db.execute("DELETE FROM sessions WHERE key = %s", (subject.value,))
                found.sessions = sorted(set(found.sessions) | {subject.value})
                if not subject.value.startswith("trace:"):
                    found.conversations = sorted(set(found.conversations) | {subject.value})
            found.counts["sessions"] = before - db.execute("SELECT count(*) FROM sessions").fetchone()[0]
            erasure.gone(reading, found)
        return found

    def interrupt(self) -> None:
        """The process is stopping: a held batch is given up rather than waited with."""
        self._closing.set()

    def shutdown(self) -> None:
        self._closing.set()
        self._close_writer()
        self.close()


def rebuild_sessions(db: psycopg.Connection, keys: list[str]) -> None:
    """Sessions recomputed from their traces, after retention removed some (schema.py's, in PostgreSQL's SQL)."""
    outcome = "coalesce(((step::jsonb) -> 'tools' ->> '{0}')::bigint, 0)"
    db.execute("DELETE FROM sessions WHERE key = ANY(%s)", (keys,))
    db.execute(f"""
        INSERT INTO sessions
        SELECT session, max(conversation), max(model), max(client), max(client_version), min(start_ns), max(start_ns),
               count(*), sum(coalesce(input_tokens, 0)), sum(coalesce(output_tokens, 0)),
               {', '.join(f"sum({outcome.format(o)})" for o in ('valid', 'invalid_args', 'unknown_tool', 'unparsed'))},
               count(*) FILTER (WHERE status = 'error'),
               (SELECT t2.trace_id FROM traces t2 WHERE t2.session = traces.session AND t2.fork_of IS NULL
                ORDER BY t2.start_ns DESC LIMIT 1), max(tenant)
        FROM traces WHERE fork_of IS NULL AND session = ANY(%s) GROUP BY session""", (keys,))
