"""The looptrace server, in three layers; data flows one way through them:

    api/      HTTP: Chat Completions, Responses, traces, health; request parsing and answer formats
    engine/   one request's run: the served model (runtime), render → decode → parse (generation)
    observe/  watches the engine: spans, per-request traces, metrics

api → engine → families and backends; observe is handed to the engine as its observer. The rules
are contracts in pyproject.toml, checked by import-linter.
"""
