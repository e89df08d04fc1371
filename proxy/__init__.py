"""The looptrace server, in three layers; data flows one way through them:

    api/      HTTP: Chat Completions, Responses, traces, health; request parsing and answer formats
    engine/   one request's run: the served model (runtime), render → decode → parse (generation)
    observe/  watches the engine: each request's spans and metrics (read-only observers), the
              conversations' state, the metrics' definitions

api → engine → families and backends; the engine tells observe's observers what happened, and they
never change it. The rules are contracts in pyproject.toml, checked by import-linter.
"""
