"""What the server's readers may ask of any trace store, and what a store says when it cannot answer.

The viewer, rollouts, export, replay and fork read the store through `TraceStore` alone, whichever
kind `--trace-db` chose (sqlite/ or postgres/), and catch `StoreUnavailable` alone: each store turns
its driver's errors (sqlite3.Error, psycopg's) into it, so no reader names a driver.
"""

from __future__ import annotations

from typing import Any, Protocol

# A result row, read by column name or by position: sqlite3.Row, or postgres/connections.Row.
Row = Any


class StoreUnavailable(OSError):
    """The store cannot be reached or read now (the trace API answers 503, saying why)."""


class TraceStore(Protocol):
    """The read side every store has (queries.py), and where it is (`where`: never a password)."""

    where: str

    def list_traces(self, *, conversation: str | None = None, model: str | None = None,
                    since_ns: int | None = None, before: tuple[int, str] | None = None,
                    limit: int = 50) -> dict: ...

    def get_trace(self, trace_id: str) -> dict | None: ...

    def tokens(self, trace_id: str) -> dict | None: ...

    def generated_ids(self, trace_id: str) -> list[int]: ...

    def replay_steps(self, spec: str) -> list[dict]: ...

    def list_sessions(self, *, model: str | None = None, client: str | None = None, since_ns: int | None = None,
                      until_ns: int | None = None, text: str | None = None, before: tuple[int, str] | None = None,
                      limit: int = 50, keys: list[str] | None = None) -> dict: ...

    def session(self, key: str, offset: int = 0, limit: int | None = None) -> dict | None: ...

    def tool_results(self, calls: dict[str, tuple[str, str]]) -> dict[str, tuple[str, str | None]]: ...
