"""`looptrace mcp`: the trace store as an MCP server (the official `mcp` SDK's MCPServer), read-only,
over stdio (a harness starts it) or streamable HTTP (`--port`, at /mcp, behind the store's keys:
access.py).

Over stdio it reads as the operator who holds the store (every tenant's records), or as `--tenant`'s.
Each tool's store reads run on a thread, off the SDK's event loop.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

INSTALL = "the MCP server needs the mcp package: pip install 'looptrace[mcp]'"


def run(args: argparse.Namespace) -> int:
    try:
        importlib.import_module("mcp.server")  # an optional extra: said in a line where it is missing
    except ImportError:
        print(f"looptrace mcp: {INSTALL}", file=sys.stderr)
        return 2
    from looptrace.trace_store.recorded_sessions import ReplayError, open_reader

    from .app import build

    try:
        store = open_reader(args.store)
    except ReplayError as exc:
        print(f"looptrace mcp: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)  # stdout is the protocol's, over stdio
    if args.port is None:
        build(store, args.tenant, http=False).run("stdio")
        return 0
    verifier = _verifier(args.store)
    if isinstance(verifier, str):
        print(f"looptrace mcp: {verifier}", file=sys.stderr)
        return 2
    server = build(store, None, http=True, verifier=verifier, host=args.host, port=args.port)
    server.run("streamable-http", host=args.host, port=args.port)
    return 0


def _verifier(spec: str):
    """The store's keys as the SDK's token verifier, or why HTTP cannot be served."""
    from looptrace.trace_store.api_keys import KeySecretMismatch, KeyStore, server_secret
    from looptrace.trace_store.location import open_state

    from .access import StoreKeys

    try:
        keys = KeyStore(open_state(spec), server_secret())
        made = keys.any()
    except KeySecretMismatch as exc:
        return str(exc)
    except OSError as exc:
        return f"the keys in the store cannot be read: {exc}"
    if not made:
        return ("--port serves the store over HTTP to holders of its keys, and it has none: make one with "
                f"`looptrace keys create NAME --scope traces:read --store {spec}`, or use stdio (no --port)")
    return StoreKeys(keys)
