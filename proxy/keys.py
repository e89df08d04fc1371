"""`looptrace keys`: API keys for a team sharing one looptrace, kept in its trace store
(trace_store/api_keys.py).

    looptrace keys create NAME [--tenant T] [--scope infer,traces:read] [--models M,…]
                          [--tokens-per-day N] [--requests-per-minute N] --store PATH_OR_URL
    looptrace keys list --store PATH_OR_URL
    looptrace keys revoke NAME --store PATH_OR_URL

`create` prints the new key once, alone on the last line of standard output; nothing keeps it. Once a
store holds a key, a server on it asks every request for one (docs/teams.md).
"""

from __future__ import annotations

import argparse
import json
import sys

from looptrace.common.option_values import count


def add_command(commands) -> None:
    keys = commands.add_parser("keys", help="make, list and revoke API keys kept in a trace store",
                               description="API keys for the people and services sharing this looptrace: each sees "
                               "only its tenant's traces (docs/teams.md).")
    actions = keys.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="make a key; it is printed once, on the last line")
    create.add_argument("name", help="the key's name (letters, digits, '_', '.', '@', '-'): listed, logged, a label")
    create.add_argument("--tenant", help="whose traces it reads and writes (default: the key's name); keys of one "
                        "tenant see each other's")
    create.add_argument("--scope", default="infer,traces:read",
                        help="comma-separated: infer (the APIs), traces:read (the viewer's data), erase (its tenant's "
                        "sessions), export, admin "
                        "(everything, every tenant) (default: infer,traces:read)")
    create.add_argument("--models", help="comma-separated model names it may use (default: every one)")
    create.add_argument("--tokens-per-day", type=count, metavar="N", help="a budget of tokens (prompt and answer)")
    create.add_argument("--requests-per-minute", type=count, metavar="N", help="a budget of requests")
    listed = actions.add_parser("list", help="the keys: names, tenants, scopes, last use (never a key)")
    revoke = actions.add_parser("revoke", help="refuse a key from now on (within a second, on every server)")
    revoke.add_argument("name")
    for parser in (create, listed, revoke):
        parser.add_argument("--store", required=True, metavar="PATH_OR_URL",
                            help="the trace store, as --trace-db takes it (a SQLite file or a PostgreSQL URL)")
    keys.set_defaults(run="looptrace.proxy.keys:run")


def run(args: argparse.Namespace) -> int:
    from looptrace.trace_store.api_keys import KeySecretMismatch, KeyStore, server_secret
    from looptrace.trace_store.interface import StoreUnavailable
    from looptrace.trace_store.location import open_state, parse, unreadable

    try:
        # Keys live in the state beside the traces (a SQLite store's file of its own, made when missing:
        # keys may come before the first `serve`); a PostgreSQL server must answer now.
        location = parse(args.store)
        refused = "--store off keeps no keys" if location is None else \
            None if location.kind == "sqlite" else unreadable(args.store)
    except ValueError as exc:
        refused = str(exc)
    if refused:
        print(f"looptrace keys: {refused}", file=sys.stderr)
        return 2
    state = open_state(args.store)
    try:
        keys = KeyStore(state, server_secret())
        if args.action == "create":
            key = keys.create(args.name, tenant=args.tenant, scopes=_listed(args.scope) or (),
                              models=_listed(args.models), tokens_per_day=args.tokens_per_day,
                              requests_per_minute=args.requests_per_minute)
            made = keys.find(args.name)
            print(f"Key {made.name!r} made for tenant {made.tenant!r} ({', '.join(made.scopes)}). It is shown once, "
                  "here; keep it where its user keeps secrets:", file=sys.stderr)
            print(key)
        elif args.action == "list":
            for key in keys.listed():
                print(json.dumps(key.listed(), sort_keys=True))
        elif not keys.revoke(args.name):
            print(f"looptrace keys: no key called {args.name!r} is in use", file=sys.stderr)
            return 1
        else:
            print(f"Key {args.name!r} revoked: refused from now on.", file=sys.stderr)
        return 0
    except (ValueError, KeySecretMismatch) as exc:
        print(f"looptrace keys: {exc}", file=sys.stderr)
        return 2
    except (StoreUnavailable, OSError) as exc:
        print(f"looptrace keys: {exc}", file=sys.stderr)
        return 1
    finally:
        state.close()


def _listed(value: str | None) -> tuple[str, ...] | None:
    return tuple(part.strip() for part in value.split(",") if part.strip()) if value else None
