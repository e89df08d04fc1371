"""The PostgreSQL store (`--trace-db postgresql://…`), shared by every looptrace process that names it:
the traces (store.py, schema.py, write.py, queries.py) and the conversations' state and stored
responses (state.py) in one database. What location.py's table of store kinds opens; psycopg is
imported only here, when one is named."""

from __future__ import annotations


def open_store(target: str, **settings):
    from .store import PostgresTraceStore

    return PostgresTraceStore(target, **settings)


def open_queries(target: str):
    from .queries import PostgresQueries

    return PostgresQueries(target)


def open_state(target: str):
    from .state import PostgresState

    return PostgresState(target)


def unreadable(target: str) -> str | None:
    """One attempt, as libpq makes it: a wrong password or a server that is down, said once."""
    import psycopg

    from ..urls import redacted
    from .connections import CONNECT_SECONDS

    try:
        with psycopg.connect(target, connect_timeout=CONNECT_SECONDS) as conn:
            (found,) = conn.execute("SELECT to_regclass('sessions')").fetchone()
    except psycopg.Error as exc:
        said = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        return f"cannot connect to {redacted(target)}: {said or 'no reason given'}"
    if found is None:  # an empty database, or its schema not on the URL's search_path
        return (f"{redacted(target)} holds no looptrace tables (a store is a database `looptrace serve --trace-db` "
                "has written to)")
    return None
