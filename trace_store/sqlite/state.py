"""Conversation state, stored responses (state.py) and rollouts (rollouts.py) in SQLite: a file of their own beside the
traces (`traces.state.sqlite3`). The trace writer holds the traces file's one write lock for whole
batches (and retention for longer), and a request must not wait behind it."""

from __future__ import annotations

import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..interface import StoreUnavailable
from ..state import StateStore

SQLITE_TABLES = """
CREATE TABLE IF NOT EXISTS state_conversations (key TEXT PRIMARY KEY, seen BLOB, digests BLOB,
                                                updated_ns INTEGER NOT NULL, seen_trace TEXT, encoding INTEGER,
                                                digests_trace TEXT, seen_prompt INTEGER);
CREATE TABLE IF NOT EXISTS state_turns (key TEXT PRIMARY KEY, ids BLOB NOT NULL, prompt_length INTEGER NOT NULL,
                                        encoding INTEGER, label TEXT, digests BLOB, updated_ns INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS state_calls (call_id TEXT PRIMARY KEY, conversation TEXT, trace_id TEXT NOT NULL,
                                        span_id TEXT NOT NULL, name TEXT, noted_ns INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS state_responses (id TEXT PRIMARY KEY, conversation BLOB NOT NULL, response BLOB NOT NULL,
                                            size INTEGER NOT NULL, created_ns INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS state_compactions (id TEXT PRIMARY KEY, summary BLOB NOT NULL, conversation TEXT,
                                              trace_id TEXT, created_ns INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS state_secrets (name TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS erasures (id INTEGER PRIMARY KEY, at_ns INTEGER NOT NULL, who TEXT NOT NULL,
                                     kind TEXT NOT NULL, subject TEXT NOT NULL, counts TEXT NOT NULL, tenant TEXT);
CREATE TABLE IF NOT EXISTS api_keys (name TEXT PRIMARY KEY, tenant TEXT NOT NULL, scopes TEXT NOT NULL, models TEXT,
                                     tokens_per_day INTEGER, requests_per_minute INTEGER, digest TEXT NOT NULL UNIQUE,
                                     created_ns INTEGER NOT NULL, revoked_ns INTEGER, last_used_ns INTEGER);
CREATE TABLE IF NOT EXISTS budget_use (name TEXT NOT NULL, kind TEXT NOT NULL, starts INTEGER NOT NULL,
                                       used INTEGER NOT NULL, PRIMARY KEY (name, kind, starts));
CREATE INDEX IF NOT EXISTS state_compactions_by_time ON state_compactions (created_ns);
CREATE INDEX IF NOT EXISTS state_conversations_by_time ON state_conversations (updated_ns);
CREATE INDEX IF NOT EXISTS state_turns_by_time ON state_turns (updated_ns);
CREATE INDEX IF NOT EXISTS state_calls_by_conversation ON state_calls (conversation);
CREATE INDEX IF NOT EXISTS state_calls_by_time ON state_calls (noted_ns);
CREATE INDEX IF NOT EXISTS state_responses_by_time ON state_responses (created_ns);
CREATE TABLE IF NOT EXISTS rollouts (key TEXT PRIMARY KEY, grp TEXT, reward REAL, info TEXT, weight_version TEXT,
                                     updated_ns INTEGER NOT NULL, size INTEGER);
CREATE TABLE IF NOT EXISTS rollout_rewards (key TEXT NOT NULL, step TEXT NOT NULL, reward REAL NOT NULL, info TEXT,
                                            noted_ns INTEGER NOT NULL, PRIMARY KEY (key, step));
CREATE TABLE IF NOT EXISTS trainer_logprobs (trace_id TEXT PRIMARY KEY, key TEXT NOT NULL, logprobs BLOB NOT NULL,
                                             weight_version TEXT, noted_ns INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS rollouts_by_group ON rollouts (grp, updated_ns);
CREATE INDEX IF NOT EXISTS rollouts_by_time ON rollouts (updated_ns);
CREATE INDEX IF NOT EXISTS trainer_logprobs_by_key ON trainer_logprobs (key);
"""


# Added to a table after its first version: (table, column, type), for a file made before.
ADDED_COLUMNS = (("state_conversations", "seen_trace", "TEXT"), ("state_conversations", "encoding", "INTEGER"),
                 ("state_conversations", "digests_trace", "TEXT"), ("state_conversations", "seen_prompt", "INTEGER"),
                 ("rollouts", "size", "INTEGER"), ("erasures", "tenant", "TEXT"))


class SQLiteState(StateStore):
    def __init__(self, path: str | Path) -> None:
        super().__init__()
        self.path = Path(path)
        self.where = str(self.path)
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Another process's write holds the file for a moment at most: a second is a fault.
            conn = sqlite3.connect(self.path, timeout=1, check_same_thread=False, isolation_level=None)
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.executescript(SQLITE_TABLES)
            for table, column, kind in ADDED_COLUMNS:  # a file made by an earlier looptrace
                if column not in {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}:
                    conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
            self._conn = conn
        return self._conn

    def _read(self, statements: list[tuple[str, tuple]]) -> list[list]:
        with self._lock, _unavailable(self.path):
            conn = self._connection()
            conn.execute("BEGIN")
            try:
                return [conn.execute(sql, args).fetchall() for sql, args in self._storable(statements)]
            finally:
                conn.execute("COMMIT")

    def _write(self, statements: list[tuple[str, tuple]]) -> list[int]:
        with self._lock, _unavailable(self.path):
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE")  # the write lock first: no upgrade from a read to wait on
            try:
                counts = [conn.execute(sql, args).rowcount for sql, args in self._storable(statements)]
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return counts

    def scrub(self) -> None:
        """After an erasure: the file rebuilt and its write-ahead log emptied, so that the erased rows'
        bytes leave the files (trace_store/erasure.py)."""
        with self._lock, _unavailable(self.path):
            conn = self._connection()
            conn.execute("VACUUM")
            checkpoint(conn, self.path)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


@contextmanager
def _unavailable(path: Path) -> Iterator[None]:
    """SQLite's errors (locked past the timeout, not a database, a full disk) as every store says them."""
    try:
        yield
    except sqlite3.Error as exc:
        raise StoreUnavailable(f"{path}: {exc}") from exc


def checkpoint(conn: sqlite3.Connection, path: Path, tries: int = 50) -> None:
    """The write-ahead log copied into the file and cut to nothing, once no reader holds it (a server
    reading the file: waited for a few seconds at most, then said)."""
    for _ in range(tries):
        busy = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
        if not busy:
            return
        time.sleep(0.1)
    raise sqlite3.OperationalError(f"{path}-wal: a reader held the write-ahead log; run the erasure again")


def sqlite_state_path(trace_path: str | Path) -> Path:
    """The state file beside a traces file: traces.sqlite3 → traces.state.sqlite3."""
    path = Path(trace_path)
    return path.with_name(f"{path.stem}.state{path.suffix or '.sqlite3'}")
