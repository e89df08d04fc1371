"""`looptrace erase`: everything a session (or a tenant's sessions, or what is older than a date) left in
a store, deleted, its bytes out of a SQLite store's files (trace_store/erasure.py); `--list`: the
erasures made, who made them and what they removed (never content).

    looptrace erase (--session KEY | --tenant T | --before DATE | --list) --store PATH_OR_URL
"""

from __future__ import annotations

import argparse
import json
import sys


def add_command(commands) -> None:
    erase = commands.add_parser(
        "erase", help="erase a session, a tenant's sessions or what is older than a date, from a store",
        description="Deletes the traces (spans, prompts, tokens, searchable text), the conversation state, stored "
        "Responses responses, compaction summaries and rollout rows of what is named. A SQLite store's files are "
        "rebuilt so the bytes leave them; PostgreSQL frees deleted rows' space at its own VACUUM.")
    erase.add_argument("--store", required=True, metavar="PATH_OR_URL",
                       help="the trace store, as --trace-db takes it (a SQLite file or a PostgreSQL URL)")
    which = erase.add_mutually_exclusive_group(required=True)
    which.add_argument("--session", metavar="KEY", help="one session, by the key the viewer shows")
    which.add_argument("--tenant", metavar="T", help="every session of tenant T")
    which.add_argument("--before", metavar="DATE", help="everything older than DATE (ISO 8601, or Unix seconds)")
    which.add_argument("--list", action="store_true", help="the erasures made (who, what, when, rows removed)")
    erase.set_defaults(run="looptrace.proxy.erase:run")


def run(args: argparse.Namespace) -> int:
    from looptrace.trace_store import erasure
    from looptrace.trace_store.interface import StoreUnavailable
    from looptrace.trace_store.location import open_state, parse, unreadable

    try:
        parse(args.store)
        refused = unreadable(args.store)
        subject = None if args.list else (
            erasure.Subject("session", args.session) if args.session is not None else
            erasure.Subject("tenant", args.tenant) if args.tenant is not None else erasure.Subject.before(args.before))
    except ValueError as exc:
        refused = str(exc)
    if refused:
        print(f"looptrace erase: {refused}", file=sys.stderr)
        return 2
    state = open_state(args.store)
    try:
        if args.list:
            for row in erasure.erasures(state, 10_000):
                print(json.dumps(row, sort_keys=True))
            return 0
        store = _store(args.store)
        try:
            done = erasure.erase(store, state, subject, "cli")
        finally:
            store.shutdown()
    except ValueError as exc:  # a subject this store cannot name (--tenant before tenants)
        print(f"looptrace erase: {exc}", file=sys.stderr)
        return 2
    except (StoreUnavailable, OSError) as exc:
        print(f"looptrace erase: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - a driver's error (locked, refused), said in one line
        print(f"looptrace erase: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        state.close()
    print(json.dumps(done, sort_keys=True))
    removed = sum(done["removed"].values())
    print(f"looptrace erase: {done['kind']} {done['subject']!r}: {removed} rows removed", file=sys.stderr)
    return 0


def _store(setting: str):
    """The store's writing side, without retention of its own (an erasure is not a server)."""
    from looptrace.trace_store.location import _kind, parse

    location = parse(setting)
    return _kind(location).open_store(location.target, retention_seconds=float("inf"), max_bytes=1 << 62)
