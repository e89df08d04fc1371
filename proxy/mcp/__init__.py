"""`looptrace mcp`: the trace store as an MCP server agents read their own traces through (server.py:
the command and its transports; tools.py and diffs.py: the tools; text.py: their results bounded;
access.py: the store's keys over HTTP; arguments.py: its command line)."""
