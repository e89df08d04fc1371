"""The store's queries (queries.py) on a SQLite file: any thread may read; each query opens its own
read-only connection, so readers never wait for the writer (WAL mode). A store that does not exist
yet reads as empty."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from ..queries import TraceQueries
from ..records import storable


class SQLiteQueries(TraceQueries):
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.where = str(self.path)

    def _reader(self) -> _Reads:
        if not self.path.exists():
            raise FileNotFoundError(f"no trace store at {self.path} yet")
        db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=5)
        db.row_factory = sqlite3.Row
        return _Reads(db)


class _Reads:
    """A read-only connection, closed after the query; text a client sent is made storable first."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> _Reads:
        return self

    def __exit__(self, *exc) -> None:
        self._db.close()

    def execute(self, sql: str, args=()):
        return self._db.execute(sql, [storable(a) if type(a) is str else a for a in args])
