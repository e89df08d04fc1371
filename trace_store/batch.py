"""One export batch as rows, written with a handful of statements.

The writer shares the serving process's GIL. Each statement the sqlite3 module runs releases the
GIL while SQLite works and must win it back afterwards; with the event loop busy, winning it back
can take a switch interval (5 ms). A statement per span made the writer wait on the GIL thousands
of times a second under load and fall behind (measured: 31,000 spans/s alone, 107 spans/s beside a
busy thread). So a batch is first turned into rows in Python, then written as a few multi-row
INSERTs per table: the GIL changes hands a few times per batch, not per span.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan

from looptrace.common import attributes as attr
from looptrace.common.jsonio import dumps

from .chains import base_rows, compacted
from .packing import Unpackable, pack
from .queries import storable
from .schema import SPAN_COLUMNS
from .steps import StepGatherer, searchable_text

OUTCOME_COLUMNS = {"valid": "tools_valid", "invalid_args": "tools_invalid_args",
                   "unknown_tool": "tools_unknown_tool", "unparsed": "tools_unparsed"}

TRACE_COLUMNS = ("trace_id", "start_ns", "end_ns", "endpoint", "model", "conversation", "status", "http_status",
                 "input_tokens", "output_tokens", "session", "client", "client_version", "error", "finish_reason",
                 "fork_of", "step")

SESSION_UPSERT = f"""
ON CONFLICT (key) DO UPDATE SET
    model = coalesce(excluded.model, model), client = coalesce(excluded.client, client),
    client_version = coalesce(excluded.client_version, client_version),
    first_ns = min(first_ns, excluded.first_ns), last_ns = max(last_ns, excluded.last_ns),
    last_trace_id = CASE WHEN excluded.last_ns >= last_ns THEN excluded.last_trace_id ELSE last_trace_id END,
    steps = steps + 1, input_tokens = input_tokens + excluded.input_tokens,
    output_tokens = output_tokens + excluded.output_tokens, errors = errors + excluded.errors,
    {", ".join(f"{c} = {c} + excluded.{c}" for c in OUTCOME_COLUMNS.values())}"""

# A tool's result, seen in a later request, joins the execute_tool span that asked for it.
ATTACH_RESULTS = """
WITH result (call_id, extra) AS (VALUES {rows}),
     target AS (SELECT s.rowid AS id, r.extra FROM result r JOIN tool_calls t USING (call_id)
                JOIN spans s ON s.trace_id = t.trace_id AND s.span_id = t.span_id)
UPDATE spans SET attributes = json_patch(attributes, (SELECT extra FROM target WHERE id = spans.rowid))
WHERE rowid IN (SELECT id FROM target) AND json_valid(attributes)"""


def hex_id(value: int, width: int) -> str:
    """A trace id (width 32) or span id (16) as OTLP's JSON and the store write it."""
    return format(value, f"0{width}x")


class Batch:
    """Rows for each table, gathered from spans in the order they ended."""

    def __init__(self, steps: StepGatherer) -> None:
        self._steps = steps
        self.spans: list[tuple] = []
        self.tool_calls: list[tuple] = []
        self.results: list[tuple] = []
        self.traces: list[tuple] = []
        self.texts: list[tuple] = []
        self.sessions: list[tuple] = []
        self.bases: list[tuple] = []  # trace_bases rows (chains.py)
        self.stored: list[dict] = []  # the step summaries of the requests this batch completes

    def add(self, span: ReadableSpan) -> None:
        ctx = span.context
        trace_id, span_id = hex_id(ctx.trace_id, 32), hex_id(ctx.span_id, 16)
        attrs = dict(span.attributes) if span.attributes else {}
        events = [{"name": e.name, "time_unix_nano": e.timestamp, "attributes": dict(e.attributes or {})}
                  for e in span.events]
        links = [{"trace_id": hex_id(link.context.trace_id, 32), "span_id": hex_id(link.context.span_id, 16),
                  "attributes": dict(link.attributes or {})} for link in span.links]
        status = span.status.status_code.name.lower()
        kept, tokens = packed_events(events)
        # Text a client may have sent (a model's name is in the span's) is made storable: a lone
        # surrogate in one request's model once failed the whole batch, everyone's spans with it.
        self.spans.append((trace_id, span_id, hex_id(span.parent.span_id, 16) if span.parent else None,
                           storable(span.name),
                           span.kind.name.lower(), span.start_time, span.end_time, status, dumps(compacted(attrs)),
                           dumps(kept), dumps(links), tokens))
        self.bases += base_rows(trace_id, span_id, attrs)
        call_id = attrs.get(attr.GEN_AI_TOOL_CALL_ID)
        if call_id and span.name.startswith(attr.SPAN_EXECUTE_TOOL):
            self.tool_calls.append((_text(call_id), trace_id, span_id))
        for event in events:
            if event["name"] == attr.EVENT_TOOL_RESULT:
                result = event["attributes"]
                extra = {attr.TOOL_RESULT_TRACE_ID: trace_id}
                if attr.TOOL_RESULT in result:
                    extra[attr.TOOL_RESULT] = result[attr.TOOL_RESULT]
                self.results.append((_text(result.get(attr.GEN_AI_TOOL_CALL_ID)), dumps(extra)))
        if attr.ENDPOINT not in attrs:
            self._steps.add(trace_id, span.name, attrs, span.start_time, span.end_time)
            return
        step = self._steps.finish(trace_id, attrs, span.start_time, span.end_time, status)
        self._add_trace(attrs, step)
        self.stored.append(step)

    def _add_trace(self, attrs: dict, step: dict) -> None:
        trace_id, fork_of = step["trace_id"], (step.get("fork_of") or {}).get("trace_id")
        conversation = _text(attrs.get(attr.GEN_AI_CONVERSATION_ID))
        session = step["session"] = conversation or f"trace:{trace_id}"
        client, version = _text(attrs.get(attr.CLIENT_NAME)), _text(attrs.get(attr.CLIENT_VERSION))
        model = _text(step.get("model"))
        self.traces.append((trace_id, step["start_ns"], step["end_ns"], _text(step.get("endpoint")), model,
                            conversation, step["status"], step.get("http_status"), step.get("input_tokens"),
                            step.get("output_tokens"), session, client, version, _text(step.get("error")),
                            _text(step.get("finish_reason")), _text(fork_of), dumps(step)))
        text = searchable_text(step)
        if text:
            self.texts.append((trace_id, storable(text)))
        if fork_of:
            return  # a fork is shown with the step it continued, not as a step of the session
        tools = step["tools"]
        self.sessions.append((session, conversation, model, client, version, step["start_ns"],
                              step["start_ns"], 1, step.get("input_tokens") or 0, step.get("output_tokens") or 0,
                              *(tools.get(outcome, 0) for outcome in OUTCOME_COLUMNS),
                              int(step["status"] == "error"), trace_id))

    def write(self, db: sqlite3.Connection) -> None:
        """In the caller's transaction. Spans and tool calls before the results that join them."""
        insert(db, f"INSERT OR REPLACE INTO spans ({', '.join(SPAN_COLUMNS)}) VALUES", self.spans)
        insert(db, "INSERT OR REPLACE INTO tool_calls VALUES", self.tool_calls)
        insert(db, "INSERT OR REPLACE INTO trace_bases VALUES", [tuple(map(_text, row)) for row in self.bases])
        insert(db, f"INSERT OR REPLACE INTO traces ({', '.join(TRACE_COLUMNS)}) VALUES", self.traces)
        insert(db, "INSERT INTO trace_text (trace_id, text) VALUES", self.texts)
        insert(db, "INSERT INTO sessions VALUES", self.sessions, SESSION_UPSERT)
        for rows in _chunks(self.results, 2, db):
            db.execute(ATTACH_RESULTS.format(rows=_placeholders(2, len(rows))), [v for row in rows for v in row])


def _text(value):
    return storable(value) if type(value) is str else value


def packed_events(events: list[dict]) -> tuple[list[dict], bytes | None]:
    """A span's events as stored: its token events' attributes packed into one blob (packing.py), the
    events left in place with none of their own; or all of them as they are, and no blob."""
    groups = [e["attributes"] for e in events if e["name"] == attr.EVENT_TOKENS]
    if not groups:
        return events, None
    try:
        blob = pack(groups)
    except Unpackable:
        return events, None
    return [{**e, "attributes": {}} if e["name"] == attr.EVENT_TOKENS else e for e in events], blob


def insert(db: sqlite3.Connection, head: str, rows: Sequence[tuple], tail: str = "") -> None:
    """`head` (… VALUES) with as many rows per statement as SQLite's variable limit allows."""
    if not rows:
        return
    for chunk in _chunks(rows, len(rows[0]), db):
        db.execute(f"{head} {_placeholders(len(rows[0]), len(chunk))}{tail}", [v for row in chunk for v in row])


CHUNK_ROWS = 256  # rows per statement at most: few distinct statements to prepare, few GIL hand-offs


def _chunks(rows: Sequence[tuple], width: int, db: sqlite3.Connection):
    size = max(1, min(CHUNK_ROWS, db.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // width))
    for start in range(0, len(rows), size):
        yield rows[start:start + size]


def _placeholders(width: int, count: int) -> str:
    row = "(" + ",".join("?" * width) + ")"
    return ",".join([row] * count)
