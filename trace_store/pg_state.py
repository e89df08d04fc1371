"""The conversation state and stored responses (state.py) in PostgreSQL, on a pool of their own.

A request waits for these (its previous prompt, its stored response), so a read or a write is
pipelined into one round trip, and a connection is waited for briefly: the caller (proxy/observe/
conversations.py, response_store.py) runs them off the event loop with a deadline, and serves from
its own memory while the store does not answer.
"""

from __future__ import annotations

import threading

import psycopg
from psycopg_pool import PoolTimeout

from .location import redacted
from .pg_schema import prepare
from .postgres import StoreUnavailable, pool
from .state import StateStore

WAIT = 0.5  # seconds to wait for a pooled connection


class PostgresState(StateStore):
    ALL = "ALL"

    def __init__(self, url: str) -> None:
        super().__init__()
        self.where = redacted(url)
        self._pool = pool(url, name="looptrace-state", size=4, statement_timeout_ms=2000)
        self._prepared = False
        self._preparing = threading.Lock()

    def _run(self, statements: list[tuple[str, tuple]], transaction: bool) -> list:
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
                    else:
                        cursors = [conn.execute(_params(sql), args) for sql, args in statements]
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
