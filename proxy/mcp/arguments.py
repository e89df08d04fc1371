"""The command line of `looptrace mcp` (server.py runs it, imported only then: the `mcp` SDK is an
optional extra, and `looptrace --help` stays quick)."""

from __future__ import annotations

from looptrace.common.option_values import port


def add_command(commands) -> None:
    mcp = commands.add_parser(
        "mcp", help="serve the trace store to agents as an MCP server (stdio, or streamable HTTP with --port)",
        description="A read-only MCP server over the trace store: list_sessions, get_session, get_step, search, "
        "diff_steps (docs/mcp.md).")
    mcp.add_argument("--store", required=True, metavar="PATH_OR_URL",
                     help="the trace store, as --trace-db takes it (a SQLite file or a PostgreSQL URL)")
    mcp.add_argument("--port", type=port, default=None,
                     help="serve streamable HTTP at http://HOST:PORT/mcp, each request with a key of the store's "
                     "(traces:read; its tenant's records alone); without it, stdio")
    mcp.add_argument("--host", default="127.0.0.1", help="the address --port listens on (default: 127.0.0.1)")
    mcp.add_argument("--tenant", metavar="T",
                     help="over stdio, only tenant T's records (default: every tenant's, as the operator who holds "
                     "the store); over HTTP each key's tenant decides")
    mcp.set_defaults(run="looptrace.proxy.mcp.server:run")
