"""The conversation state and stored responses (state.py) in PostgreSQL, on a pool of their own.

A request waits for these (its previous prompt, its stored response), so a read or a write is
pipelined into one round trip, its connection is not checked first (another round trip; a connection
the server dropped is found by using it, and the statements tried once more on a fresh one), a commit
does not wait for the disk (this is state a crash of the server may lose the last moments of, not a
record), and a connection is waited for briefly: the caller (proxy/observe/conversations.py,
proxy/api/openai/responses/store.py) runs these off the event loop with a deadline, and serves from its own memory
while the store does not answer.
"""

from __future__ import annotations

import threading

import psycopg
from psycopg_pool import PoolTimeout

from ..interface import StoreUnavailable
from ..state import StateStore
from ..urls import redacted
from .connections import pool
from .schema import prepare

WAIT = 0.5  # seconds to wait for a pooled connection


class PostgresState(StateStore):
    ALL = "ALL"

    def __init__(self, url: str) -> None:
        super().__init__()
        self.where = redacted(url)
        self._pool = pool(url, name="looptrace-state", size=4, statement_timeout_ms=2000, checked=False,
                          synchronous=False)
        self._prepared = False
        self._preparing = threading.Lock()

    def _run(self, statements: list[tuple[str, tuple]], transaction: bool) -> list:
        try:
            return self._once(statements, transaction)
        except StoreUnavailable as exc:
            if not isinstance(exc.__cause__, psycopg.OperationalError) or isinstance(exc.__cause__, PoolTimeout):
                raise
            return self._once(statements, transaction)  # a connection the server dropped: once more, on another

    def _once(self, statements: list[tuple[str, tuple]], transaction: bool) -> list:
        statements = self._storable(statements)
        try:
            with self._pool.connection(timeout=WAIT) as conn:
                if not self._prepared:  # the tables, once, should this process reach the server before its writer
                    with self._preparing:
                        prepare(conn)
                        self._prepared = True
                with conn.pipeline():
                    if transaction:
                        with conn.transaction():
                            cursors = [conn.execute(_params(sql), args) for sql, args in statements]
                    else:  # results in binary: a prompt's packed ids as they are, not as hex text
                        cursors = [conn.execute(_params(sql), args, binary=True) for sql, args in statements]
                return [c.rowcount if transaction else c.fetchall() for c in cursors]
        except PoolTimeout as exc:
            raise StoreUnavailable(f"no connection to {self.where} within {WAIT:g} s") from exc
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(str(exc).strip() or type(exc).__name__) from exc

    def _read(self, statements: list[tuple[str, tuple]]) -> list[list]:
        return self._run(statements, transaction=False)

    def _write(self, statements: list[tuple[str, tuple]]) -> list[int]:
        return self._run(statements, transaction=True)

    def close(self) -> None:
        self._pool.close(timeout=1)


def _params(sql: str) -> str:
    return sql.replace("%", "%%").replace("?", "%s")
