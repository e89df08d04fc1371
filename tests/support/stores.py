"""The trace store's tests run on both stores: a `Stores` makes stores of one kind for a test (SQLite
files in its folder, or PostgreSQL schemas of the tests' database, dropped after), gives the
`--trace-db` setting that names one, and reads and changes their tables with plain SQL, so a test
can say what is in a store, or age its rows, whichever store it is."""

from __future__ import annotations

import sqlite3
import time
import uuid
from pathlib import Path

KINDS = ("sqlite", "postgresql")

# Each table's rows in an order independent of how they were written, as both stores hold them.
TABLES = {
    "spans": "SELECT trace_id, span_id, parent_id, name, start_ns, end_ns, status, attributes, events, links, tokens "
             "FROM spans ORDER BY trace_id, span_id",
    "traces": "SELECT trace_id, start_ns, end_ns, endpoint, model, conversation, status, http_status, input_tokens, "
              "output_tokens, session, client, client_version, error, finish_reason, fork_of, step "
              "FROM traces ORDER BY trace_id",
    "sessions": "SELECT * FROM sessions ORDER BY key",
    "tool_calls": "SELECT * FROM tool_calls ORDER BY call_id",
}
TEXT = {"sqlite": "SELECT trace_id, text FROM trace_text ORDER BY trace_id",  # a step's searchable text
        "postgresql": "SELECT trace_id, string_agg(text, '' ORDER BY part) FROM trace_text GROUP BY trace_id "
                      "ORDER BY trace_id"}


def of_param(request, folder: Path) -> "Stores":
    """Stores of the kind a fixture is parametrized with (`request.param`, one of KINDS)."""
    url = request.getfixturevalue("postgres_url") if request.param == "postgresql" else None
    return Stores(request.param, folder, url)


class Stores:
    def __init__(self, kind: str, folder: Path, postgres_url: str | None = None) -> None:
        self.kind, self.folder, self.postgres_url = kind, folder, postgres_url
        self._schemas: list[str] = []
        self._made: list = []

    def setting(self, name: str = "traces") -> str:
        """A `--trace-db` naming a new, empty store."""
        if self.kind == "sqlite":
            return str(self.folder / f"{name}-{uuid.uuid4().hex[:6]}.sqlite3")
        import postgres

        url = postgres.fresh_schema(self.postgres_url)
        self._schemas.append(url)
        return url

    def make(self, setting: str | None = None, **kwargs):
        """A store (opened: its tables made), new unless `setting` names one."""
        setting = setting or self.setting()
        if self.kind == "sqlite":
            from looptrace.trace_store.sqlite.store import SQLiteTraceStore

            store = SQLiteTraceStore(setting, **kwargs)
        else:
            from looptrace.trace_store.postgres.store import PostgresTraceStore

            store = PostgresTraceStore(setting, **kwargs)
        store.open()
        store.setting = setting
        self._made.append(store)
        return store

    def state(self, setting: str):
        """The conversation-state store at `setting`; on PostgreSQL once its pool holds a connection. A
        request waits 0.5 s for one (pg_state.WAIT) and is then served from the process's memory, by
        design; a fresh pool's first connection took longer on a busy machine, and a test of what two
        processes share then found nothing shared."""
        from looptrace.trace_store.location import open_state

        state = open_state(setting)
        if self.kind == "postgresql":
            state._pool.wait(timeout=30)
        return state

    def sql(self, store, statement: str, args: tuple = ()) -> list[tuple]:
        """A statement on the store's own database (`?` placeholders), committed; its rows, if any."""
        if self.kind == "sqlite":
            with sqlite3.connect(store.setting) as db:
                return db.execute(statement, args).fetchall()
        import psycopg

        with psycopg.connect(store.setting, autocommit=True) as conn:
            cursor = conn.execute(statement.replace("?", "%s"), args)
            return [tuple(row) for row in cursor.fetchall()] if cursor.description else []

    def contents(self, store) -> dict:
        found = {table: [tuple(bytes(v) if isinstance(v, memoryview) else v for v in row)
                         for row in self.sql(store, query)] for table, query in TABLES.items()}
        found["trace_text"] = self.sql(store, TEXT[self.kind])
        return found

    def close(self) -> None:
        for store in self._made:
            store.shutdown()
        if self._schemas:
            import postgres

            for url in self._schemas:
                postgres.drop_schema(self.postgres_url, url)


class SilentState:
    """A state store (trace_store/state.py's) that does not answer: a server stopped (refused at once),
    or frozen (`hang`: each call takes 3 s, then fails)."""

    where = "postgresql://nowhere/x"

    def __init__(self, hang: bool) -> None:
        self.hang = hang

    def _fail(self, *args, **kwargs):
        if self.hang:
            time.sleep(3)
        raise ConnectionError("connection refused")

    load = calls = save = load_turn = save_turn = put_response = get_response = delete_response = _fail
    put_compaction = get_compaction = secret = _fail

    def close(self) -> None:
        pass
