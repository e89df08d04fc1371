"""The store's queries (queries.py) on a SQLite file: any thread may read; each query opens its own
read-only connection, so readers never wait for the writer (WAL mode). A store that does not exist
yet reads as empty."""

from __future__ import annotations

import sqlite3
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..interface import StoreUnavailable
from ..queries import TraceQueries
from ..records import storable


class SQLiteQueries(TraceQueries):
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.where = str(self.path)

    @contextmanager
    def _reader(self) -> Iterator[_Reads]:
        """A read-only connection, closed after the query. SQLite's errors (not a database, locked, a
        folder) leave as StoreUnavailable, what every store raises."""
        if not self.path.exists():
            raise FileNotFoundError(f"no trace store at {self.path} yet")
        try:
            db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=5)
            try:
                db.row_factory = sqlite3.Row
                yield _Reads(db)
            finally:
                db.close()
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"{self.path}: {exc}") from exc


class _Reads:
    """A connection's queries; text a client sent is made storable first."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def execute(self, sql: str, args=()):
        return self._db.execute(sql, [storable(a) if type(a) is str else a for a in args])
