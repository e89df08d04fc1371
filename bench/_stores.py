"""The trace store under benchmark, either kind: a SQLite file in a folder of the bench's own, or a fresh
schema of a PostgreSQL database (the tests' own by default: tests/support/postgres.py starts Debian's
cluster and sets up its role), with what the benches measure of it: bytes on disk, and the bytes its
token events take."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from urllib.parse import quote

from looptrace.common import attributes as attr


class BenchStore:
    def __init__(self, kind: str, folder: Path, postgres_url: str | None = None) -> None:
        self.kind = kind
        if kind == "sqlite":
            self.setting = str(folder / "traces.sqlite3")
            return
        import psycopg

        import postgres

        self.base = postgres_url or postgres.url()
        self.schema = f"bench_{int(time.time() * 1000)}"
        with psycopg.connect(self.base, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {self.schema}")
        joiner = "&" if "?" in self.base else "?"
        self.setting = f"{self.base}{joiner}options={quote(f'-csearch_path={self.schema}', safe='')}"

    def store(self, **kwargs):
        """The store's writer and reader, its tables made."""
        if self.kind == "sqlite":
            from looptrace.trace_store.sqlite.store import SQLiteTraceStore

            made = SQLiteTraceStore(self.setting, **kwargs)
        else:
            from looptrace.trace_store.postgres.store import PostgresTraceStore

            made = PostgresTraceStore(self.setting, **kwargs)
        made.open()
        return made

    def rows(self, sql: str, args: tuple = ()) -> list[tuple]:
        if self.kind == "sqlite":
            with sqlite3.connect(self.setting) as db:
                return db.execute(sql, args).fetchall()
        import psycopg

        with psycopg.connect(self.setting, autocommit=True) as conn:
            cursor = conn.execute(sql.replace("?", "%s"), args)
            return [tuple(r) for r in cursor.fetchall()] if cursor.description else []

    def size(self) -> int:
        """Bytes on disk: the SQLite file and its journal, or the schema's tables with their indexes and TOAST."""
        if self.kind == "sqlite":
            path = Path(self.setting)
            return path.stat().st_size + sum(p.stat().st_size for p in path.parent.glob(path.name + "-*"))
        return int(self.rows("SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c JOIN pg_namespace n "
                             "ON n.oid = c.relnamespace WHERE n.nspname = ? AND c.relkind = 'r'", (self.schema,))[0][0])

    def token_bytes(self) -> int:
        """What the decode spans' events take, packed or as JSON: the part packing is about."""
        length = "length" if self.kind == "sqlite" else "octet_length"
        return int(self.rows(f"SELECT coalesce(sum({length}(events)), 0) + coalesce(sum({length}(tokens)), 0) "
                             "FROM spans WHERE name = ?", (attr.SPAN_DECODE,))[0][0])

    def drop(self) -> None:
        if self.kind == "postgresql":
            import psycopg

            with psycopg.connect(self.base, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")

    def multiply(self, copies: int, span_seconds: int) -> float:
        """The store's traces, sessions, spans and texts copied COPIES more times by the database itself
        (each copy a new random trace id; its conversation, session and times its own, moved
        SPAN_SECONDS further back per copy): a store of a million traces in minutes, whose first tenth
        went through the store's own writer. Returns the seconds it took."""
        import time as clock

        fresh = {"sqlite": "lower(hex(randomblob(16)))", "postgresql": "md5(random()::text || k.k || t.trace_id)"}
        series = {"sqlite": "(WITH RECURSIVE s(k) AS (SELECT 1 UNION ALL SELECT k + 1 FROM s WHERE k < {n}) "
                            "SELECT k FROM s)",
                  "postgresql": "(SELECT generate_series(1, {n}) AS k)"}[self.kind].format(n=copies)
        shift = f"c.k * {span_seconds * 10**9}"  # a literal past 32 bits: the product is 64-bit
        counted = ", bytes" if self.kind == "postgresql" else ""  # what retention by size counts there
        text_columns = "part, text" if self.kind == "postgresql" else "text"
        started = clock.perf_counter()
        statements = [
            "CREATE TABLE bench_copies (old TEXT, k INTEGER, new TEXT)",
            f"INSERT INTO bench_copies SELECT t.trace_id, k.k, {fresh[self.kind]} FROM "
            f"(SELECT trace_id FROM traces UNION SELECT trace_id FROM spans) t, {series} k",
            "CREATE INDEX bench_copies_old ON bench_copies (old)",
            f"""INSERT INTO traces (trace_id, start_ns, end_ns, endpoint, model, conversation, status, http_status,
                input_tokens, output_tokens, session, client, client_version, error, finish_reason, fork_of, step{counted})
                SELECT c.new, start_ns - {shift}, end_ns - {shift}, endpoint, model, conversation || '-' || c.k, status,
                http_status, input_tokens, output_tokens, session || '-' || c.k, client, client_version, error,
                finish_reason, fork_of, step{counted} FROM traces JOIN bench_copies c ON c.old = traces.trace_id""",
            f"""INSERT INTO spans (trace_id, span_id, parent_id, name, kind, start_ns, end_ns, status, attributes, events,
                links, tokens{counted}) SELECT c.new, span_id, parent_id, name, kind, start_ns - {shift}, end_ns - {shift},
                status, attributes, events, links, tokens{counted} FROM spans JOIN bench_copies c ON c.old = spans.trace_id""",
            f"""INSERT INTO sessions SELECT key || '-' || c.k, conversation || '-' || c.k, model, client, client_version,
                first_ns - {shift}, last_ns - {shift}, steps, input_tokens, output_tokens, tools_valid,
                tools_invalid_args, tools_unknown_tool, tools_unparsed, errors, c.new
                FROM sessions JOIN bench_copies c ON c.old = sessions.last_trace_id""",
            f"INSERT INTO trace_text (trace_id, {text_columns}) SELECT c.new, {text_columns} FROM trace_text "
            "JOIN bench_copies c ON c.old = trace_text.trace_id",
            "DROP TABLE bench_copies",
        ]
        if self.kind == "postgresql":
            statements.append("INSERT INTO store_usage SELECT 1, (SELECT sum(bytes) * %d FROM store_usage) "
                              "ON CONFLICT (writer) DO UPDATE SET bytes = store_usage.bytes + excluded.bytes" % copies)
            statements.append("ANALYZE")
        for statement in statements:
            self.rows(statement)
        return clock.perf_counter() - started
