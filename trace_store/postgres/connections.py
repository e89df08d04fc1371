"""Connections to the PostgreSQL store: pools for reading and for conversation state, rows read by
position or by name as sqlite3's are. What a store that cannot be reached raises is interface.py's
StoreUnavailable."""

from __future__ import annotations

from typing import Sequence

import psycopg
from psycopg_pool import ConnectionPool

from ..records import storable

CONNECT_SECONDS = 5  # libpq's connect_timeout


READ_WAIT = 3.0  # seconds a read waits for a pooled connection before it is a 503


class Row:
    """A result row read by position or by column name, as sqlite3.Row is (queries.py reads both)."""

    __slots__ = ("_values", "_names")

    def __init__(self, values: Sequence, names: dict[str, int]) -> None:
        self._values, self._names = values, names

    def __getitem__(self, key):
        return self._values[self._names[key] if type(key) is str else key]


def row_factory(cursor):
    names = {column.name: i for i, column in enumerate(cursor.description or ())}
    return lambda values: Row(values, names)


class _Reading:
    """A pooled connection as queries.py uses one: execute(sql with `?` placeholders, args). Text a
    client sent (a search, a filter, a key in a path) is made storable first: PostgreSQL's text holds
    no NUL, so such a search finds what it would find stored, instead of failing."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, args: Sequence = ()):
        args = [storable(a) if type(a) is str else a for a in args]
        return self._conn.execute(sql.replace("%", "%%").replace("?", "%s"), args)


def connect(url: str, **kwargs) -> psycopg.Connection:
    return psycopg.connect(url, connect_timeout=CONNECT_SECONDS, **kwargs)


def pool(url: str, *, name: str, size: int, statement_timeout_ms: int, checked: bool = True,
         synchronous: bool = True) -> ConnectionPool:
    """A small pool that opens in the background: a server that is down delays nothing at start, and
    is connected to again once it is back. `checked`: each connection is tried before it is handed
    out (a round trip; without it, the caller tries again on a connection the server dropped).
    `synchronous=False`: a commit does not wait for the disk (for what may lose its last moments)."""

    def configure(conn: psycopg.Connection) -> None:
        conn.execute(f"SET statement_timeout = {int(statement_timeout_ms)}")
        if not synchronous:
            conn.execute("SET synchronous_commit = off")

    opened = ConnectionPool(url, min_size=1, max_size=size, open=False, timeout=READ_WAIT, name=name,
                            kwargs={"autocommit": True, "row_factory": row_factory, "connect_timeout": CONNECT_SECONDS},
                            configure=configure, check=ConnectionPool.check_connection if checked else None,
                            reconnect_timeout=0)
    opened.open(wait=False)
    return opened
