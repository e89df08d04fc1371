"""Where `--trace-db` puts the store, and opening it: one function for the server, one for readers.

`--trace-db` is a file path (SQLite, the embedded default), `off`, or a PostgreSQL URL
(`postgresql://user:password@host:5432/db`). Anything else shaped like a URL (`scheme://…`) is
refused at once, naming what is taken: a URL must never become a folder of that name with the
password in it. Where a store is shown (logs, errors, /health) its URL has no password.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from urllib.parse import urlsplit, urlunsplit

from platformdirs import user_data_dir

POSTGRES_SCHEMES = ("postgresql", "postgres")  # what libpq takes
URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


@dataclass(frozen=True, slots=True)
class Location:
    kind: str  # "sqlite" or "postgresql"
    target: str  # the file's path, or the URL as given (with its password: never shown)

    @property
    def shown(self) -> str:
        return self.target if self.kind == "sqlite" else redacted(self.target)


def parse(setting: str | None) -> Location | None:
    """`--trace-db` → where the store is; None for `off`. Raises ValueError for a URL of another kind."""
    if setting == "off":
        return None
    if not setting:
        return Location("sqlite", str(Path(user_data_dir("looptrace")) / "traces.sqlite3"))
    url = URL.match(setting)
    if url:
        scheme = url.group(1).lower()
        if scheme in POSTGRES_SCHEMES:
            return Location("postgresql", setting)
        raise ValueError(f"--trace-db: {scheme}:// is not a store looptrace can use. It takes a file path (SQLite), "
                         f"'off', or a PostgreSQL URL ({' or '.join(s + '://' for s in POSTGRES_SCHEMES)}…)")
    return Location("sqlite", str(Path(setting).expanduser()))


def refusal(setting: str | None) -> str | None:
    """Why `--trace-db` cannot be used, for the command line to say before anything starts."""
    try:
        parse(setting)
    except ValueError as exc:
        return str(exc)
    return None


def redacted(url: str) -> str:
    """A URL as it may be shown: no password, no query (libpq takes one there too)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        netloc = (f"{parts.username}@" if parts.username else "") + (f"[{host}]" if ":" in host else host)
        if parts.port:
            netloc += f":{parts.port}"
    except ValueError:
        return url.split("://", 1)[0] + "://…"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def open_store(setting: str | None, *, retention_seconds: float, max_bytes: int,
               on_written: Callable[[list[dict]], None] | None = None):
    """The store `--trace-db` names, ready for spans (its tables created or upgraded; a store that
    cannot be reached now is retried, never fatal), or None for `off`."""
    location = parse(setting)
    if location is None:
        return None
    if location.kind == "postgresql":
        from .postgres import PostgresTraceStore  # psycopg only where it is used

        store = PostgresTraceStore(location.target, retention_seconds=retention_seconds, max_bytes=max_bytes,
                                   on_written=on_written)
    else:
        from .sqlite import SQLiteTraceStore

        store = SQLiteTraceStore(location.target, retention_seconds=retention_seconds, max_bytes=max_bytes,
                                 on_written=on_written)
    store.open()
    return store


def open_queries(setting: str | None):
    """The store's read side alone (for `--replay` from traces), or None for `off`."""
    location = parse(setting)
    if location is None:
        return None
    if location.kind == "postgresql":
        from .postgres import PostgresQueries

        return PostgresQueries(location.target)
    from .queries import SQLiteQueries

    return SQLiteQueries(location.target)


def unreadable(setting: str | None) -> str | None:
    """Why the store `setting` names cannot be read now, in one line, or None when it can. For a
    command that reads a store once (`looptrace replay`, `looptrace export`) and must say so at once:
    the server's pool waits and retries in the background, logging each failed attempt."""
    location = parse(setting)
    if location is None:
        return None
    if location.kind == "sqlite":
        path = Path(location.target)
        if not path.is_file():
            return f"no such file: {path} (a SQLite store is the file `looptrace serve --trace-db` writes)"
        import sqlite3

        try:
            with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)) as db:
                db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.Error as exc:
            return f"{path} cannot be read as a SQLite store: {exc}"
        return None
    import psycopg  # one attempt, as libpq makes it: a wrong password or a server that is down, said once

    from .postgres import CONNECT_SECONDS

    try:
        psycopg.connect(location.target, connect_timeout=CONNECT_SECONDS).close()
    except psycopg.Error as exc:
        said = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        return f"cannot connect to {location.shown}: {said or type(exc).__name__}"
    return None


def open_state(setting: str | None):
    """Where conversations' state and stored responses live beside the store (state.py), or None for
    `off` (then each process keeps its own, in memory)."""
    location = parse(setting)
    if location is None:
        return None
    if location.kind == "postgresql":
        from .pg_state import PostgresState

        return PostgresState(location.target)
    from .state import SQLiteState, sqlite_state_path

    return SQLiteState(sqlite_state_path(location.target))
