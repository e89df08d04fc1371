"""The store's tables, and bringing an older file up to them.

    spans       every span as recorded: attributes, events (a decode span's tokens), links
    traces      one row per request, from its server span: what the trace API lists, and the step
                summary (steps.py) the trace viewer shows for it
    sessions    one row per agent conversation (or per request that carries none), kept up to date
                as requests are stored, so that listing sessions never scans traces
    trace_text  what a person searches for (new messages, the model's output), full-text indexed
    tool_calls  call id → the span that made the call, so a result seen later can join it
    lost_spans  traces that lost spans before they were stored (a full queue, a failed batch)
    trace_bases where each step's prompt and input messages are stored, and the step they build on
                (chains.py: a long session's steps are stored as what each adds)

A span's token events are kept packed in `spans.tokens` (packing.py) since version 4; a span
stored before that keeps them in `events` as JSON, and reads back the same.
"""

from __future__ import annotations

import sqlite3

from ..records import OUTCOMES

VERSION = 6  # PRAGMA user_version; 0 is the first schema (spans, traces, tool_calls)


TABLES = """
CREATE TABLE IF NOT EXISTS spans (
    trace_id TEXT NOT NULL, span_id TEXT NOT NULL, parent_id TEXT, name TEXT NOT NULL, kind TEXT,
    start_ns INTEGER, end_ns INTEGER, status TEXT, attributes TEXT, events TEXT, links TEXT,
    PRIMARY KEY (trace_id, span_id)
);
CREATE TABLE IF NOT EXISTS traces (
    trace_id TEXT PRIMARY KEY, start_ns INTEGER, end_ns INTEGER, endpoint TEXT, model TEXT,
    conversation TEXT, status TEXT, http_status INTEGER, input_tokens INTEGER, output_tokens INTEGER
);
CREATE TABLE IF NOT EXISTS tool_calls (call_id TEXT PRIMARY KEY, trace_id TEXT, span_id TEXT);
"""

# Added in version 2, to `traces`: (column, type).
TRACE_COLUMNS = (
    ("session", "TEXT"),  # the conversation id, or "trace:" + the trace id for a request without one
    ("client", "TEXT"), ("client_version", "TEXT"), ("error", "TEXT"), ("finish_reason", "TEXT"),
    ("fork_of", "TEXT"),  # the trace a fork continued
    ("step", "TEXT"),  # JSON: the step summary (steps.py)
    ("tenant", "TEXT"),  # whose request it was (version 6: the key's tenant; NULL on an open server)
)

VERSION_2 = """
CREATE TABLE IF NOT EXISTS sessions (
    key TEXT PRIMARY KEY, conversation TEXT, model TEXT, client TEXT, client_version TEXT,
    first_ns INTEGER, last_ns INTEGER, steps INTEGER, input_tokens INTEGER, output_tokens INTEGER,
    tools_valid INTEGER, tools_invalid_args INTEGER, tools_unknown_tool INTEGER, tools_unparsed INTEGER,
    errors INTEGER, last_trace_id TEXT
);
CREATE VIRTUAL TABLE IF NOT EXISTS trace_text USING fts5(trace_id UNINDEXED, text, tokenize = 'unicode61 remove_diacritics 2');
"""

VERSION_3 = """
CREATE TABLE IF NOT EXISTS lost_spans (trace_id TEXT PRIMARY KEY, spans INTEGER NOT NULL, noted_ns INTEGER NOT NULL);
"""

# Version 4: token events packed (packing.py), and indexes that list the sessions' models and
# clients without reading every session.
VERSION_4_COLUMNS = (("spans", "tokens", "BLOB"), ("sessions", "tenant", "TEXT"))  # the latter: version 6

# Version 5: where each step's prompt and input messages are stored, and the step they build on
# (chains.py: NULL for one stored whole).
VERSION_5 = """
CREATE TABLE IF NOT EXISTS trace_bases (trace_id TEXT NOT NULL, kind TEXT NOT NULL, span_id TEXT NOT NULL, base TEXT,
                                        PRIMARY KEY (trace_id, kind));
CREATE INDEX IF NOT EXISTS trace_bases_by_base ON trace_bases (base) WHERE base IS NOT NULL;
"""

INDEXES = """
CREATE INDEX IF NOT EXISTS traces_by_start ON traces (start_ns);
CREATE INDEX IF NOT EXISTS traces_by_conversation ON traces (conversation, start_ns);
CREATE INDEX IF NOT EXISTS traces_by_session ON traces (session, start_ns);
CREATE INDEX IF NOT EXISTS traces_by_fork ON traces (fork_of) WHERE fork_of IS NOT NULL;
CREATE INDEX IF NOT EXISTS sessions_by_last ON sessions (last_ns, key);
CREATE INDEX IF NOT EXISTS sessions_by_model ON sessions (model);
CREATE INDEX IF NOT EXISTS sessions_by_client ON sessions (client);
CREATE INDEX IF NOT EXISTS traces_by_tenant ON traces (tenant, start_ns) WHERE tenant IS NOT NULL;
CREATE INDEX IF NOT EXISTS sessions_by_tenant ON sessions (tenant, last_ns) WHERE tenant IS NOT NULL;
"""




def prepare(db: sqlite3.Connection) -> None:
    """Creates the tables, or brings an older file up to this version (its traces stay readable)."""
    db.execute("PRAGMA auto_vacuum = INCREMENTAL")  # takes effect on a new file: lets retention shrink it
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = NORMAL")
    # A checkpoint leaves the write-ahead log at its largest size unless told otherwise; past this, it
    # is cut back, so that the store's size limit holds for the files on disk.
    db.execute("PRAGMA journal_size_limit = 67108864")
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version >= VERSION:
        return
    with db:
        db.executescript(TABLES)
        have = {row[1] for row in db.execute("PRAGMA table_info(traces)")}
        for column, kind in TRACE_COLUMNS:
            if column not in have:
                db.execute(f"ALTER TABLE traces ADD COLUMN {column} {kind}")
        db.executescript(VERSION_2)
        db.executescript(VERSION_3)
        db.executescript(VERSION_5)
        for table, column, kind in VERSION_4_COLUMNS:
            if column not in {row[1] for row in db.execute(f"PRAGMA table_info({table})")}:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
        db.executescript(INDEXES)
        if version < 2:  # traces stored before sessions existed: their sessions, from what their rows say
            db.execute("UPDATE traces SET session = coalesce(conversation, 'trace:' || trace_id) WHERE session IS NULL")
            rebuild_sessions(db, None)
        db.execute(f"PRAGMA user_version = {VERSION}")


def rebuild_sessions(db: sqlite3.Connection, keys: list[str] | None) -> None:
    """Sessions recomputed from their traces (all of them when `keys` is None): after retention
    removed some of a session's traces, or after an upgrade."""
    where, args = ("", ()) if keys is None else (f" AND session IN ({','.join('?' * len(keys))})", tuple(keys))
    if keys is not None:
        db.execute(f"DELETE FROM sessions WHERE key IN ({','.join('?' * len(keys))})", args)
    else:
        db.execute("DELETE FROM sessions")
    outcome = "coalesce(json_extract(step, '$.tools.{0}'), 0)"
    db.execute(f"""
        INSERT INTO sessions
        SELECT session, conversation, max(model), max(client), max(client_version), min(start_ns), max(start_ns),
               count(*), sum(coalesce(input_tokens, 0)), sum(coalesce(output_tokens, 0)),
               {', '.join(f'sum({outcome.format(o)})' for o in OUTCOMES)},
               sum(status = 'error'),
               (SELECT t2.trace_id FROM traces t2 WHERE t2.session = traces.session AND t2.fork_of IS NULL
                ORDER BY t2.start_ns DESC LIMIT 1), max(tenant)
        FROM traces WHERE fork_of IS NULL{where} GROUP BY session""", args)
