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
            from looptrace.trace_store.sqlite import SQLiteTraceStore

            made = SQLiteTraceStore(self.setting, **kwargs)
        else:
            from looptrace.trace_store.postgres import PostgresTraceStore

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
