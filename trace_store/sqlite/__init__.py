"""The SQLite store, the embedded default: the traces in one file (store.py, schema.py, queries.py)
and the conversations' state and stored responses in another beside it (state.py). What
location.py's table of store kinds opens."""

from __future__ import annotations

import contextlib
from pathlib import Path


def open_store(target: str, **settings):
    from .store import SQLiteTraceStore

    return SQLiteTraceStore(target, **settings)


def open_queries(target: str):
    from .queries import SQLiteQueries

    return SQLiteQueries(target)


def open_state(target: str):
    from .state import SQLiteState, sqlite_state_path

    return SQLiteState(sqlite_state_path(target))


def unreadable(target: str) -> str | None:
    import sqlite3

    path = Path(target)
    if not path.is_file():
        return f"no such file: {path} (a SQLite store is the file `looptrace serve --trace-db` writes)"
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)) as db:
            found = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'sessions'").fetchone()
    except sqlite3.Error as exc:
        return f"{path} cannot be read as a SQLite store: {exc}"
    if found is None:
        return (f"{path} is a SQLite file without looptrace's tables (a store is the file `looptrace serve "
                "--trace-db` writes)")
    return None
