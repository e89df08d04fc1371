"""The embedded trace store: spans in one SQLite file, written in batches off the event loop.

`export` runs on the exporting thread only (it owns the writing connection); reading is
queries.py's, on connections of its own. Retention by age and by size runs between batches, a
little at a time. Any SQLite failure fails the batch, which the processor counts as dropped; a
failure of retention after it does not. Each transaction takes the write lock before it reads
(BEGIN IMMEDIATE): another writer on the file (a replay, a second server) is then waited for, where a
transaction that read first would fail at once on meeting it.
Traces that lost spans on the way (`note_lost`) are marked in `lost_spans`, so that nobody reads
them as whole.

With each request's server span, the store also keeps what the trace viewer reads without opening
every span: the request's step summary (steps.py), its session's running totals, and its text,
indexed for search. `on_written` hears of every stored request, after its batch is committed.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from ..batch import Batch, hex_id
from .. import erasure
from ..chains import materialize
from ..steps import StepGatherer
from .queries import SQLiteQueries
from .schema import prepare, rebuild_sessions
from .state import SQLiteState, checkpoint, sqlite_state_path
from .write import insert, write

log = logging.getLogger("looptrace.trace")

MAX_PENDING_LOST = 100_000  # traces waiting to be marked incomplete while the store cannot write
RETENTION_INTERVAL = 5.0  # seconds between looks at age and size: a busy store grows fast
RETIRE_PER_BATCH = 2000  # traces retention deletes after a batch, at most (about 0.3 s here)


class SQLiteTraceStore(SQLiteQueries, SpanExporter):
    sink = "sqlite"  # its queue's name in the metrics

    def __init__(self, path: str | Path, *, retention_seconds: float = 7 * 86400, max_bytes: int = 1 << 30,
                 on_written: Callable[[list[dict]], None] | None = None) -> None:
        super().__init__(path)
        self.retention_seconds = retention_seconds
        self.max_bytes = max_bytes
        self.on_written = on_written  # called on the writing thread with each batch's stored steps
        self._db: sqlite3.Connection | None = None
        self._last_retention = 0.0
        self._retiring = False  # retention has more to delete: a little more after each batch
        self._steps = StepGatherer()
        self._lost: dict[str, int] = {}  # trace id → spans lost, not yet marked in the file
        # The writing connection's one user at a time: the exporting thread, or an erasure (a route's thread).
        self._writing = threading.RLock()
        self._retired: list[erasure.Found] = []  # what retention removed, for the state beside it to follow

    # -- writing (the exporting thread) --

    def _writer(self) -> sqlite3.Connection:
        if self._db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Used by the exporting thread only; shutdown closes it after that thread has stopped.
            db = sqlite3.connect(self.path, timeout=5, check_same_thread=False)
            prepare(db)
            self._db = db
        return self._db

    def open(self) -> None:
        """Creates the file, or upgrades an older one, now rather than at the first batch: readers
        (the trace viewer) find the current tables from the start. Never raises: a store that cannot
        be opened loses spans, never requests."""
        try:
            self._writer()
        except (sqlite3.Error, OSError) as exc:
            log.warning("trace store %s: %s", self.path, exc)
            self._close_writer()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self._writing:
            return self._export(spans)

    def _export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            db = self._writer()
            batch = Batch(self._steps)
            for span in spans:
                batch.add(span)
            with db:
                db.execute("BEGIN IMMEDIATE")
                write(db, batch)
                self._write_lost(db)
        except (sqlite3.Error, OSError) as exc:
            log.warning("trace store %s: %s", self.path, exc)
            self._close_writer()  # reopen next time: the disk may have room again
            return SpanExportResult.FAILURE
        self._retain()
        if batch.stored and self.on_written is not None:
            try:
                self.on_written(batch.stored)
            except Exception:  # noqa: BLE001 - a listener's failure is not the store's
                log.exception("trace store listener failed")
        return SpanExportResult.SUCCESS

    def note_lost(self, lost: dict[int, int]) -> None:
        """Traces that lost spans before reaching the store (a full queue, a failed batch): marked
        with the next batch, so they read as incomplete. Called on the exporting thread."""
        for trace_id, count in lost.items():
            key = hex_id(trace_id, 32)
            if key in self._lost or len(self._lost) < MAX_PENDING_LOST:
                self._lost[key] = self._lost.get(key, 0) + count

    def _write_lost(self, db: sqlite3.Connection) -> None:
        if not self._lost:
            return
        now = time.time_ns()
        insert(db, "INSERT INTO lost_spans VALUES", [(t, n, now) for t, n in self._lost.items()],
               " ON CONFLICT (trace_id) DO UPDATE SET spans = spans + excluded.spans")
        self._lost = {}  # only once written: a failed batch keeps them for the next

    def _close_writer(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def _retain(self) -> None:
        """Retention's turn after a batch, if due. Its failure is not the batch's: that is stored."""
        if not self._retiring and time.monotonic() - self._last_retention <= RETENTION_INTERVAL:
            return
        try:
            self._retiring = not self._retire(RETIRE_PER_BATCH)
            self._forget_retired()
        except (sqlite3.Error, OSError) as exc:
            log.warning("trace store %s: retention: %s", self.path, exc)
            self._retired = []  # rolled back
            self._close_writer()
        self._last_retention = time.monotonic()

    def enforce_retention(self) -> None:
        """All of retention, now."""
        with self._writing:
            while not self._retire(None):
                pass
            self._forget_retired()

    def _forget_retired(self) -> None:
        """The state rows of what retention removed (conversations and rollouts none of whose traces is
        left, responses and calls of the traces removed), in the state's own file. Its failure is logged:
        the state is bounded by itself too."""
        retired, self._retired = self._retired, []
        if not retired:
            return
        found = erasure.Found()
        for part in retired:
            for name in ("traces", "conversations", "sessions", "responses"):
                getattr(found, name).extend(getattr(part, name))
        state = SQLiteState(sqlite_state_path(self.path))
        try:
            erasure.forget(state, found)
        except OSError as exc:
            log.warning("trace store %s: retention of the state beside it: %s", self.path, exc)
        finally:
            state.close()

    def erase(self, subject: erasure.Subject) -> erasure.Found:
        """Every trace of `subject` (erasure.py), its rows in every table, and their bytes out of the file
        and its write-ahead log: the FTS index merged without them, the file rebuilt, the log emptied.
        Holds the writer meanwhile: this process's batches wait; another process's writer waits for the
        file's lock (its busy timeout), as for any long transaction."""
        with self._writing:
            db = self._writer()
            secure = ("OFF", "ON", "FAST")[db.execute("PRAGMA secure_delete").fetchone()[0]]
            db.execute("PRAGMA busy_timeout = 60000")  # a server's batch or retention on the file: waited for
            db.execute("PRAGMA secure_delete = ON")  # some builds' default: the deleted cells zeroed as they go
            try:
                with db:
                    db.execute("BEGIN IMMEDIATE")
                    db.execute("CREATE TEMP TABLE IF NOT EXISTS doomed (trace_id TEXT PRIMARY KEY)")
                    db.execute("DELETE FROM doomed")
                    erasure.pick(db, subject)
                    keyed = erasure.by_key(db, subject)
                    found = self._delete_doomed(db, whole=subject.kind == "before")
                    if keyed:  # a session row whose traces went before
                        found.counts["sessions"] += db.execute("DELETE FROM sessions WHERE key = ?",
                                                               (subject.value,)).rowcount
                        if subject.value not in found.sessions:
                            found.sessions.append(subject.value)
                        if not subject.value.startswith("trace:") and subject.value not in found.conversations:
                            found.conversations.append(subject.value)
                    db.execute("INSERT INTO trace_text (trace_text) VALUES ('optimize')")  # the erased words out
                db.execute("VACUUM")
                checkpoint(db, self.path)
            finally:
                db.execute("PRAGMA busy_timeout = 5000")
                db.execute(f"PRAGMA secure_delete = {secure}")
            return found

    def _retire(self, limit: int | None) -> bool:
        """Deletes up to `limit` traces (None: no limit) past their age, else the oldest while the
        store is past its size; True once nothing is left to delete. Between batches, `limit` keeps
        each turn short: a big deletion would hold the writer while spans queue up."""
        db = self._writer()
        cutoff = time.time_ns() - int(self.retention_seconds * 1e9)
        cap = -1 if limit is None else limit  # SQLite's LIMIT -1: none
        with db:
            db.execute("BEGIN IMMEDIATE")
            deleted = self._delete(db, "SELECT trace_id FROM traces WHERE start_ns < ? ORDER BY start_ns LIMIT ?",
                                   (cutoff, cap))
            # Traces whose server span never arrived have no row in `traces`: their spans go by the
            # time they were marked lost.
            deleted += self._delete(db, "SELECT trace_id FROM lost_spans WHERE noted_ns < ? LIMIT ?", (cutoff, cap))
        if limit is not None and deleted >= limit:
            return False
        if self._used_bytes(db) > self.max_bytes:
            total = db.execute("SELECT COUNT(*) FROM traces").fetchone()[0]
            if total:
                chunk = max(1, total // 10)  # the oldest tenth at a time, until what is left fits
                with db:
                    db.execute("BEGIN IMMEDIATE")
                    self._delete(db, "SELECT trace_id FROM traces ORDER BY start_ns LIMIT ?",
                                 (chunk if limit is None else min(chunk, limit),))
                return False
        # Hand freed pages back to the file system (the size limit is about the disk), past a tenth
        # of the limit kept free for the traces to come, which would otherwise grow the file again.
        free, size = (db.execute(f"PRAGMA {p}").fetchone()[0] for p in ("freelist_count", "page_size"))
        spare = free - self.max_bytes // 10 // size
        if spare > 0:
            db.executescript(f"PRAGMA incremental_vacuum({spare});")  # executescript runs it to the end
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return True

    @staticmethod
    def _used_bytes(db: sqlite3.Connection) -> int:
        pages, free, size = (db.execute(f"PRAGMA {p}").fetchone()[0] for p in ("page_count", "freelist_count", "page_size"))
        return (pages - free) * size

    def _delete(self, db: sqlite3.Connection, select: str, args: tuple) -> int:
        """The traces `select` picks, every row of theirs, as a few set-wide statements (one per table,
        not one per trace: see batch.py on the GIL)."""
        db.execute("CREATE TEMP TABLE IF NOT EXISTS doomed (trace_id TEXT PRIMARY KEY)")
        db.execute("DELETE FROM doomed")
        db.execute(f"INSERT OR IGNORE INTO doomed {select}", args)
        found = self._delete_doomed(db, whole=True)
        self._retired.append(found)
        return len(found.traces)

    @staticmethod
    def _delete_doomed(db: sqlite3.Connection, *, whole: bool) -> erasure.Found:
        """Every row of the traces in `doomed`; `whole`: the steps left that build on them made whole
        first (chains.py). What they linked to, for the state beside the store."""
        if whole:
            materialize(db, "doomed")
        found = erasure.linked(db, "sqlite")
        for table in ("spans", "tool_calls", "trace_text", "lost_spans", "trace_bases", "traces"):
            found.counts[table] = db.execute(f"DELETE FROM {table} WHERE trace_id IN doomed").rowcount
        before = db.execute("SELECT count(*) FROM sessions").fetchone()[0]
        for start in range(0, len(found.sessions), 500):  # what is left of the sessions they belonged to
            rebuild_sessions(db, found.sessions[start:start + 500])
        found.counts["sessions"] = before - db.execute("SELECT count(*) FROM sessions").fetchone()[0]
        erasure.gone(db, found)
        return found

    def shutdown(self) -> None:
        self._close_writer()

