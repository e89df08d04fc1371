"""Where `--trace-db` puts the store, and opening it: one function for the server, one for readers.

`--trace-db` is a file path (SQLite, the embedded default), `off`, or a PostgreSQL URL
(`postgresql://user:password@host:5432/db`). Anything else shaped like a URL (`scheme://…`) is
refused at once, naming what is taken: a URL must never become a folder of that name with the
password in it. Where a store is shown (logs, errors, /health) its URL has no password.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Callable

from platformdirs import user_data_dir

from .urls import redacted

POSTGRES_SCHEMES = ("postgresql", "postgres")  # what libpq takes
# Each kind of store is a package that opens its parts: open_store, open_queries, open_state (each from
# the setting's target: a file path or a URL) and unreadable (why it cannot be read now, or None).
KINDS = {"sqlite": ".sqlite", "postgresql": ".postgres"}  # packages beside this module
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
    """Why `--trace-db` cannot be used, for the command line to say before anything starts: a URL of
    another kind, or a SQLite path no file can be made at (a folder, or under a file). A store that
    fails later is logged and serving goes on; one that never could is a mistake in the command."""
    try:
        location = parse(setting)
    except ValueError as exc:
        return str(exc)
    if location is None or location.kind != "sqlite":
        return None
    path = Path(location.target)
    if path.is_dir():
        return f"--trace-db {path} is a folder; give a file's path in it (traces.sqlite3, say)"
    folder = path.parent
    while not folder.exists() and folder != folder.parent:  # the store makes the folders that are missing
        folder = folder.parent
    if not folder.is_dir():
        return f"--trace-db {path}: {folder} is a file, so no folder can be made there"
    return None


def open_store(setting: str | None, *, retention_seconds: float, max_bytes: int,
               on_written: Callable[[list[dict]], None] | None = None):
    """The store `--trace-db` names, ready for spans (its tables created or upgraded; a store that
    cannot be reached now is retried, never fatal), or None for `off`."""
    location = parse(setting)
    if location is None:
        return None
    store = _kind(location).open_store(location.target, retention_seconds=retention_seconds, max_bytes=max_bytes,
                                       on_written=on_written)
    store.open()
    return store


def open_queries(setting: str | None):
    """The store's read side alone (for `--replay` from traces), or None for `off`."""
    location = parse(setting)
    return _kind(location).open_queries(location.target) if location is not None else None


def unreadable(setting: str | None) -> str | None:
    """Why the store `setting` names cannot be read now, in one line, or None when it can. For a
    command that reads a store once (`looptrace replay`, `looptrace export`) and must say so at once:
    the server's pool waits and retries in the background, logging each failed attempt."""
    location = parse(setting)
    return _kind(location).unreadable(location.target) if location is not None else None


def open_state(setting: str | None):
    """Where conversations' state and stored responses live beside the store (state.py), or None for
    `off` (then each process keeps its own, in memory)."""
    location = parse(setting)
    return _kind(location).open_state(location.target) if location is not None else None


def _kind(location: Location) -> ModuleType:
    # Imported when named: psycopg only where PostgreSQL is used.
    return importlib.import_module(KINDS[location.kind], __package__)
