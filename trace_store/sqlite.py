"""The embedded trace store: spans in one SQLite file, written in batches off the event loop.

`export` runs on the exporting thread only (it owns the writing connection); queries open their
own connections, so readers never wait for a writer (WAL mode). Retention by age and by size runs
between batches. Any SQLite failure fails the batch, which the processor counts as dropped.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from pathlib import Path
from typing import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from looptrace.backends.jsontext import dumps, loads

from .tokens import expand_events

log = logging.getLogger("looptrace.trace")

SCHEMA = """
CREATE TABLE IF NOT EXISTS spans (
    trace_id TEXT NOT NULL, span_id TEXT NOT NULL, parent_id TEXT, name TEXT NOT NULL, kind TEXT,
    start_ns INTEGER, end_ns INTEGER, status TEXT, attributes TEXT, events TEXT, links TEXT,
    PRIMARY KEY (trace_id, span_id)
);
CREATE TABLE IF NOT EXISTS traces (
    trace_id TEXT PRIMARY KEY, start_ns INTEGER, end_ns INTEGER, endpoint TEXT, model TEXT,
    conversation TEXT, status TEXT, http_status INTEGER, input_tokens INTEGER, output_tokens INTEGER
);
CREATE INDEX IF NOT EXISTS traces_by_start ON traces (start_ns);
CREATE INDEX IF NOT EXISTS traces_by_conversation ON traces (conversation, start_ns);
CREATE TABLE IF NOT EXISTS tool_calls (call_id TEXT PRIMARY KEY, trace_id TEXT, span_id TEXT);
"""

ROOT_MARK = "looptrace.endpoint"  # set on the request's server span only
RESULT_EVENT = "looptrace.tool_result"


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
    from platformdirs import user_data_dir

    return Path(user_data_dir("looptrace")) / "traces.sqlite3"


class SQLiteTraceStore(SpanExporter):
    def __init__(self, path: str | Path, *, retention_seconds: float = 7 * 86400, max_bytes: int = 1 << 30) -> None:
        self.path = Path(path)
        self.retention_seconds = retention_seconds
        self.max_bytes = max_bytes
        self._db: sqlite3.Connection | None = None
        self._last_retention = 0.0

    # -- writing (the exporting thread) --

    def _writer(self) -> sqlite3.Connection:
        if self._db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Used by the exporting thread only; shutdown closes it after that thread has stopped.
            db = sqlite3.connect(self.path, timeout=5, check_same_thread=False)
            db.execute("PRAGMA auto_vacuum = INCREMENTAL")  # takes effect on a new file: lets retention shrink it
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = NORMAL")
            db.executescript(SCHEMA)
            self._db = db
        return self._db

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            db = self._writer()
            with db:
                for span in spans:
                    self._write(db, span)
            if time.monotonic() - self._last_retention > 60:
                self._last_retention = time.monotonic()
                self.enforce_retention()
            return SpanExportResult.SUCCESS
        except (sqlite3.Error, OSError) as exc:
            log.warning("trace store %s: %s", self.path, exc)
            if self._db is not None:
                self._db.close()
                self._db = None  # reopen next time: the disk may have room again
            return SpanExportResult.FAILURE

    def _write(self, db: sqlite3.Connection, span: ReadableSpan) -> None:
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
        if ROOT_MARK in attrs:
            db.execute(
                "INSERT OR REPLACE INTO traces VALUES (?,?,?,?,?,?,?,?,?,?)",
                (trace_id, span.start_time, span.end_time, attrs[ROOT_MARK], attrs.get("gen_ai.request.model"),
                 attrs.get("gen_ai.conversation.id"), status, attrs.get("http.response.status_code"),
                 attrs.get("gen_ai.usage.input_tokens"), attrs.get("gen_ai.usage.output_tokens")),
            )
        call_id = attrs.get("gen_ai.tool.call.id")
        if call_id and span.name.startswith("execute_tool"):
            db.execute("INSERT OR REPLACE INTO tool_calls VALUES (?,?,?)", (call_id, trace_id, span_id))
        for event in events:
            if event["name"] == RESULT_EVENT:
                self._attach_result(db, event["attributes"], trace_id)

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
        db.executemany("DELETE FROM spans WHERE trace_id = ?", ids)
        db.executemany("DELETE FROM tool_calls WHERE trace_id = ?", ids)
        db.executemany("DELETE FROM traces WHERE trace_id = ?", ids)

    def shutdown(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    # -- reading (any thread; a connection each) --

    def _reader(self) -> sqlite3.Connection:
        if not self.path.exists():
            raise FileNotFoundError(f"no trace store at {self.path} yet")
        db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=5)
        db.row_factory = sqlite3.Row
        return db

    def list_traces(self, *, conversation: str | None = None, model: str | None = None,
                    since_ns: int | None = None, limit: int = 50) -> list[dict]:
        where, args = [], []
        for column, value in (("conversation", conversation), ("model", model)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        if since_ns is not None:
            where.append("start_ns >= ?")
            args.append(since_ns)
        sql = "SELECT * FROM traces" + (" WHERE " + " AND ".join(where) if where else "")
        sql += " ORDER BY start_ns DESC LIMIT ?"
        with self._reader() as db:
            rows = db.execute(sql, (*args, limit)).fetchall()
        return [{
            "trace_id": r["trace_id"], "start_time_unix_nano": r["start_ns"],
            "duration_ms": (r["end_ns"] - r["start_ns"]) / 1e6, "endpoint": r["endpoint"], "model": r["model"],
            "conversation": r["conversation"], "status": r["status"], "http_status": r["http_status"],
            "input_tokens": r["input_tokens"], "output_tokens": r["output_tokens"],
        } for r in rows]

    def get_trace(self, trace_id: str) -> dict | None:
        with self._reader() as db:
            rows = db.execute("SELECT * FROM spans WHERE trace_id = ? ORDER BY start_ns, rowid", (trace_id,)).fetchall()
        if not rows:
            return None
        spans = []
        for r in rows:
            events = loads(r["events"])
            span = {
                "trace_id": r["trace_id"], "span_id": r["span_id"], "parent_span_id": r["parent_id"],
                "name": r["name"], "kind": r["kind"], "start_time_unix_nano": r["start_ns"],
                "end_time_unix_nano": r["end_ns"], "duration_ms": (r["end_ns"] - r["start_ns"]) / 1e6,
                "status": r["status"], "attributes": loads(r["attributes"]), "events": events,
                "links": loads(r["links"]),
            }
            tokens = expand_events(events)
            if tokens:
                span["tokens"] = tokens
            spans.append(span)
        return {"trace_id": trace_id, "spans": spans}

    def replay_steps(self, spec: str) -> list[dict]:
        """`--replay` from the store: trace ids (comma-separated), or `conversation:ID` for every trace of
        a session, oldest first; one step of generated token ids per trace."""
        if spec.startswith("conversation:"):
            conversation = spec.removeprefix("conversation:")
            trace_ids = [t["trace_id"] for t in reversed(self.list_traces(conversation=conversation, limit=100000))]
            if not trace_ids:
                raise ValueError(f"--replay {spec}: no traces of conversation {conversation!r} in {self.path}")
        elif all(len(t) == 32 for t in spec.split(",")):
            trace_ids = spec.split(",")
        else:
            raise ValueError(f"--replay {spec}: not a file, a trace id or conversation:ID")
        return [{"token_ids": self.generated_ids(trace_id)} for trace_id in trace_ids]

    def generated_ids(self, trace_id: str) -> list[int]:
        """The token ids a traced request generated, for the replay backend."""
        found = self.get_trace(trace_id)
        if found is None:
            raise LookupError(f"no trace {trace_id} in {self.path}")
        decode = [s for s in found["spans"] if s["name"] == "decode"]
        tokens = decode[0].get("tokens", []) if decode else []
        if not tokens:
            raise LookupError(f"trace {trace_id} has no generated tokens")
        if "id" not in tokens[0]:
            raise LookupError(f"trace {trace_id} was recorded with --no-trace-content: its token ids were not kept")
        return [t["id"] for t in tokens]
