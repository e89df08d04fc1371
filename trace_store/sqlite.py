"""The embedded trace store: spans in one SQLite file, written in batches off the event loop.

`export` runs on the exporting thread only (it owns the writing connection); reading is
queries.py's, on connections of its own. Retention by age and by size runs between batches. Any
SQLite failure fails the batch, which the processor counts as dropped.

With each request's server span, the store also keeps what the trace viewer reads without opening
every span: the request's step summary (steps.py), its session's running totals, and its text,
indexed for search. `on_written` hears of every stored request, after its batch is committed.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from pathlib import Path
from typing import Callable, Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from platformdirs import user_data_dir

from looptrace.backends.jsontext import dumps, loads

from .queries import TraceQueries
from .schema import RESULT_EVENT, ROOT_MARK, prepare, rebuild_sessions
from .steps import StepGatherer, searchable_text

log = logging.getLogger("looptrace.trace")

OUTCOME_COLUMNS = {"valid": "tools_valid", "invalid_args": "tools_invalid_args",
                   "unknown_tool": "tools_unknown_tool", "unparsed": "tools_unparsed"}


def _hex(value: int, width: int) -> str:
    return format(value, f"0{width}x")


def _attributes(attrs) -> dict:
    return dict(attrs) if attrs else {}


def store_path(setting: str | None) -> Path | None:
    """Where `--trace-db` puts the store: a path, None for the default under the user's data
    directory, or "off" (None back: no store)."""
    if setting == "off":
        return None
    if setting:
        return Path(setting).expanduser()
    return Path(user_data_dir("looptrace")) / "traces.sqlite3"


class SQLiteTraceStore(TraceQueries, SpanExporter):
    def __init__(self, path: str | Path, *, retention_seconds: float = 7 * 86400, max_bytes: int = 1 << 30,
                 on_written: Callable[[list[dict]], None] | None = None) -> None:
        super().__init__(path)
        self.retention_seconds = retention_seconds
        self.max_bytes = max_bytes
        self.on_written = on_written  # called on the writing thread with each batch's stored steps
        self._db: sqlite3.Connection | None = None
        self._last_retention = 0.0
        self._steps = StepGatherer()

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
        try:
            db = self._writer()
            stored: list[dict] = []
            with db:
                for span in spans:
                    step = self._write(db, span)
                    if step is not None:
                        stored.append(step)
            if time.monotonic() - self._last_retention > 60:
                self._last_retention = time.monotonic()
                self.enforce_retention()
        except (sqlite3.Error, OSError) as exc:
            log.warning("trace store %s: %s", self.path, exc)
            self._close_writer()  # reopen next time: the disk may have room again
            return SpanExportResult.FAILURE
        if stored and self.on_written is not None:
            try:
                self.on_written(stored)
            except Exception:  # noqa: BLE001 - a listener's failure is not the store's
                log.exception("trace store listener failed")
        return SpanExportResult.SUCCESS

    def _close_writer(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def _write(self, db: sqlite3.Connection, span: ReadableSpan) -> dict | None:
        """Stores one span; for a request's server span, returns its step summary."""
        ctx = span.context
        trace_id, span_id = _hex(ctx.trace_id, 32), _hex(ctx.span_id, 16)
        attrs = _attributes(span.attributes)
        events = [{"name": e.name, "time_unix_nano": e.timestamp, "attributes": _attributes(e.attributes)}
                  for e in span.events]
        links = [{"trace_id": _hex(link.context.trace_id, 32), "span_id": _hex(link.context.span_id, 16),
                  "attributes": _attributes(link.attributes)} for link in span.links]
        parent = _hex(span.parent.span_id, 16) if span.parent else None
        status = span.status.status_code.name.lower()
        db.execute(
            "INSERT OR REPLACE INTO spans VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (trace_id, span_id, parent, span.name, span.kind.name.lower(), span.start_time, span.end_time, status,
             dumps(attrs), dumps(events), dumps(links)),
        )
        call_id = attrs.get("gen_ai.tool.call.id")
        if call_id and span.name.startswith("execute_tool"):
            db.execute("INSERT OR REPLACE INTO tool_calls VALUES (?,?,?)", (call_id, trace_id, span_id))
        for event in events:
            if event["name"] == RESULT_EVENT:
                self._attach_result(db, event["attributes"], trace_id)
        if ROOT_MARK not in attrs:
            self._steps.add(trace_id, span.name, attrs, span.start_time, span.end_time)
            return None
        step = self._steps.finish(trace_id, attrs, span.start_time, span.end_time, status)
        self._write_trace(db, attrs, step)
        return step

    def _write_trace(self, db: sqlite3.Connection, attrs: dict, step: dict) -> None:
        trace_id, fork_of = step["trace_id"], (step.get("fork_of") or {}).get("trace_id")
        conversation = attrs.get("gen_ai.conversation.id")
        session = step["session"] = conversation or f"trace:{trace_id}"
        client, version = attrs.get("looptrace.client.name"), attrs.get("looptrace.client.version")
        db.execute(
            "INSERT OR REPLACE INTO traces (trace_id, start_ns, end_ns, endpoint, model, conversation, status, "
            "http_status, input_tokens, output_tokens, session, client, client_version, error, finish_reason, "
            "fork_of, step) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (trace_id, step["start_ns"], step["end_ns"], step.get("endpoint"), step.get("model"), conversation,
             step["status"], step.get("http_status"), step.get("input_tokens"), step.get("output_tokens"), session,
             client, version, step.get("error"), step.get("finish_reason"), fork_of, dumps(step)),
        )
        text = searchable_text(step)
        if text:
            db.execute("INSERT INTO trace_text (trace_id, text) VALUES (?, ?)", (trace_id, text))
        if fork_of:
            return  # a fork is shown with the step it continued, not as a step of the session
        tools = step["tools"]
        counts = [tools.get(outcome, 0) for outcome in OUTCOME_COLUMNS]
        db.execute(
            f"""INSERT INTO sessions VALUES (?,?,?,?,?,?,?,1,?,?,?,?,?,?,?,?)
            ON CONFLICT (key) DO UPDATE SET
                model = coalesce(excluded.model, model), client = coalesce(excluded.client, client),
                client_version = coalesce(excluded.client_version, client_version),
                first_ns = min(first_ns, excluded.first_ns), last_ns = max(last_ns, excluded.last_ns),
                last_trace_id = CASE WHEN excluded.last_ns >= last_ns THEN excluded.last_trace_id ELSE last_trace_id END,
                steps = steps + 1, input_tokens = input_tokens + excluded.input_tokens,
                output_tokens = output_tokens + excluded.output_tokens, errors = errors + excluded.errors,
                {", ".join(f"{c} = {c} + excluded.{c}" for c in OUTCOME_COLUMNS.values())}""",
            (session, conversation, step.get("model"), client, version, step["start_ns"], step["start_ns"],
             step.get("input_tokens") or 0, step.get("output_tokens") or 0, *counts,
             int(step["status"] == "error"), trace_id),
        )

    def _attach_result(self, db: sqlite3.Connection, result: dict, seen_in: str) -> None:
        """A tool's result, seen in a later request, joins the execute_tool span that asked for it."""
        row = db.execute("SELECT trace_id, span_id FROM tool_calls WHERE call_id = ?",
                         (result.get("gen_ai.tool.call.id"),)).fetchone()
        if row is None:
            return
        extra = {"looptrace.tool.result_trace_id": seen_in}
        if "looptrace.tool.result" in result:
            extra["looptrace.tool.result"] = result["looptrace.tool.result"]
        attrs = loads(db.execute("SELECT attributes FROM spans WHERE trace_id = ? AND span_id = ?", row).fetchone()[0])
        attrs.update(extra)
        db.execute("UPDATE spans SET attributes = ? WHERE trace_id = ? AND span_id = ?",
                   (dumps(attrs), *row))

    def enforce_retention(self) -> None:
        db = self._writer()
        cutoff = time.time_ns() - int(self.retention_seconds * 1e9)
        with db:
            self._delete(db, "SELECT trace_id FROM traces WHERE start_ns < ?", (cutoff,))
        while self._used_bytes(db) > self.max_bytes:
            total = db.execute("SELECT COUNT(*) FROM traces").fetchone()[0]
            if total == 0:
                break
            with db:  # the oldest tenth at a time, until what is left fits
                self._delete(db, "SELECT trace_id FROM traces ORDER BY start_ns LIMIT ?", (max(1, total // 10),))
        # Hand the freed pages back to the file system: the size limit is about the disk, not the rows.
        db.executescript("PRAGMA incremental_vacuum;")  # run to the end: execute() would take one step, one page
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    @staticmethod
    def _used_bytes(db: sqlite3.Connection) -> int:
        pages, free, size = (db.execute(f"PRAGMA {p}").fetchone()[0] for p in ("page_count", "freelist_count", "page_size"))
        return (pages - free) * size

    @staticmethod
    def _delete(db: sqlite3.Connection, select: str, args: tuple) -> None:
        ids = [(r[0],) for r in db.execute(select, args).fetchall()]
        sessions = _sessions_of(db, ids)
        db.executemany("DELETE FROM spans WHERE trace_id = ?", ids)
        db.executemany("DELETE FROM tool_calls WHERE trace_id = ?", ids)
        db.executemany("DELETE FROM trace_text WHERE trace_id = ?", ids)
        db.executemany("DELETE FROM traces WHERE trace_id = ?", ids)
        for start in range(0, len(sessions), 500):  # what is left of the sessions they belonged to
            rebuild_sessions(db, sessions[start:start + 500])

    def shutdown(self) -> None:
        self._close_writer()


def _sessions_of(db: sqlite3.Connection, ids: list[tuple[str]]) -> list[str]:
    found: set[str] = set()
    for (trace_id,) in ids:
        row = db.execute("SELECT session FROM traces WHERE trace_id = ?", (trace_id,)).fetchone()
        if row and row[0]:
            found.add(row[0])
    return sorted(found)
