"""The store's queries (queries.py) on PostgreSQL, on a small pool of read connections of their own."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from ..interface import StoreUnavailable
from ..queries import TraceQueries
from ..urls import redacted
from .connections import READ_WAIT, _Reading, pool


class PostgresQueries(TraceQueries):
    ALL_ROWS = "ALL"
    SPAN_ORDER = "seq"
    # EXISTS, not IN: the planner then picks per query between probing each session newest first
    # (words every step has: the first page at once) and hashing the few matches (rare words). At a
    # million traces, IN for words every step had ran past the 10 s statement timeout; this, 6 ms.
    TEXT_MATCH = ("(strpos(lower(coalesce(conversation, key)), lower(?)) > 0 OR EXISTS ("
                  "SELECT 1 FROM traces t JOIN trace_text x ON x.trace_id = t.trace_id "
                  "WHERE t.session = sessions.key AND x.words @@ phraseto_tsquery('simple', ?)))")

    def __init__(self, url: str) -> None:
        self.url = url
        self.path = self.where = redacted(url)  # shown in messages: never the password
        self._pool: ConnectionPool | None = None
        self._pool_lock = threading.Lock()

    @staticmethod
    def _text_args(text: str) -> list:
        # The words as a phrase: phraseto_tsquery reads no operators, so nothing typed is query syntax.
        return [text, text]

    def _readers(self) -> ConnectionPool:
        with self._pool_lock:
            if self._pool is None:
                self._pool = pool(self.url, name="looptrace-read", size=4, statement_timeout_ms=10_000)
            return self._pool

    @contextmanager
    def _reader(self) -> Iterator[_Reading]:
        try:
            with self._readers().connection() as conn:
                yield _Reading(conn)
        except PoolTimeout as exc:
            raise StoreUnavailable(f"no connection to {self.where} within {READ_WAIT:g} s (is it running?)") from exc
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(str(exc).strip() or type(exc).__name__) from exc

    def close(self) -> None:
        with self._pool_lock:
            if self._pool is not None:
                self._pool.close(timeout=1)
                self._pool = None
