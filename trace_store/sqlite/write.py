"""A batch (batch.py) written into the SQLite file: a few multi-row statements per table.

The writer shares the serving process's GIL, and each statement the sqlite3 module runs gives it up
while SQLite works and must win it back (a switch interval, 5 ms, with the event loop busy): so rows
go in as many per statement as SQLite's variable limit allows, not one statement per span."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from ..batch import OUTCOME_COLUMNS, TRACE_COLUMNS, Batch
from ..records import SPAN_COLUMNS

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


def write(db: sqlite3.Connection, batch: Batch) -> None:
    """In the caller's transaction. Spans and tool calls before the results that join them."""
    insert(db, f"INSERT OR REPLACE INTO spans ({', '.join(SPAN_COLUMNS)}) VALUES", batch.spans)
    insert(db, "INSERT OR REPLACE INTO tool_calls VALUES", batch.tool_calls)
    insert(db, "INSERT OR REPLACE INTO trace_bases VALUES", batch.bases)
    insert(db, f"INSERT OR REPLACE INTO traces ({', '.join(TRACE_COLUMNS)}) VALUES", batch.traces)
    insert(db, "INSERT INTO trace_text (trace_id, text) VALUES", batch.texts)
    insert(db, "INSERT INTO sessions VALUES", batch.sessions, SESSION_UPSERT)
    for rows in _chunks(batch.results, 2, db):
        db.execute(ATTACH_RESULTS.format(rows=_placeholders(2, len(rows))), [v for row in rows for v in row])
