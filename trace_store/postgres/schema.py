"""The store's tables in PostgreSQL: the SQLite store's (schema.py says what each holds), and
bringing an older database up to them.

Differences, each for PostgreSQL's sake:
- `spans.seq`, an identity: spans that start together read in the order they were stored (SQLite's
  rowid); `spans.bytes` and `traces.bytes`, what each row holds, and `store_usage`, their sum per
  writing process: the size retention keeps under `--trace-max-mb` (PostgreSQL reuses the space
  deleted rows leave rather than shrinking its files, so a file size would never come down).
- `trace_text` holds a step's text in parts of at most TEXT_PART characters (a tsvector has a size
  limit) with their words (`to_tsvector('simple', …)`: no stemming, as SQLite's index has none) in
  a GIN index.
- `state_*`: what any process needs to serve a conversation's next turn (state.py); `rollouts`,
  `rollout_rewards`, `trainer_logprobs`: rollouts for agent RL (rollouts.py).

Every process that opens the store runs `prepare`; an advisory lock makes the ones starting
together take turns (concurrent CREATE … IF NOT EXISTS can fail).
"""

from __future__ import annotations

VERSION = 5  # store_version.version
LOCK = 0x6C6F6F70  # pg_advisory_xact_lock key: "loop"
TEXT_PART = 65536

TABLES = """
CREATE TABLE IF NOT EXISTS store_version (version integer NOT NULL);
CREATE TABLE IF NOT EXISTS spans (
    seq bigint GENERATED ALWAYS AS IDENTITY,
    trace_id text NOT NULL, span_id text NOT NULL, parent_id text, name text NOT NULL, kind text,
    start_ns bigint, end_ns bigint, status text, attributes text, events text, links text, tokens bytea,
    bytes bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (trace_id, span_id)
);
CREATE TABLE IF NOT EXISTS traces (
    trace_id text PRIMARY KEY, start_ns bigint, end_ns bigint, endpoint text, model text, conversation text,
    status text, http_status bigint, input_tokens bigint, output_tokens bigint, session text, client text,
    client_version text, error text, finish_reason text, fork_of text, step text, bytes bigint NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS tool_calls (call_id text PRIMARY KEY, trace_id text, span_id text);
CREATE TABLE IF NOT EXISTS sessions (
    key text PRIMARY KEY, conversation text, model text, client text, client_version text,
    first_ns bigint, last_ns bigint, steps bigint, input_tokens bigint, output_tokens bigint,
    tools_valid bigint, tools_invalid_args bigint, tools_unknown_tool bigint, tools_unparsed bigint,
    errors bigint, last_trace_id text
);
CREATE TABLE IF NOT EXISTS trace_text (
    trace_id text NOT NULL, part integer NOT NULL, text text NOT NULL,
    words tsvector GENERATED ALWAYS AS (to_tsvector('simple', text)) STORED,
    PRIMARY KEY (trace_id, part)
);
CREATE TABLE IF NOT EXISTS lost_spans (trace_id text PRIMARY KEY, spans bigint NOT NULL, noted_ns bigint NOT NULL);
CREATE TABLE IF NOT EXISTS store_usage (writer bigint PRIMARY KEY, bytes bigint NOT NULL);
CREATE TABLE IF NOT EXISTS trace_bases (trace_id text NOT NULL, kind text NOT NULL, span_id text NOT NULL, base text,
                                        PRIMARY KEY (trace_id, kind));
CREATE TABLE IF NOT EXISTS state_conversations (
    key text PRIMARY KEY, seen bytea, digests bytea, updated_ns bigint NOT NULL, seen_trace text, encoding bigint,
    digests_trace text, seen_prompt bigint
);
CREATE TABLE IF NOT EXISTS state_turns (
    key text PRIMARY KEY, ids bytea NOT NULL, prompt_length bigint NOT NULL, encoding bigint, label text,
    digests bytea, updated_ns bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS state_calls (
    call_id text PRIMARY KEY, conversation text, trace_id text NOT NULL, span_id text NOT NULL, name text,
    noted_ns bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS state_responses (
    id text PRIMARY KEY, conversation bytea NOT NULL, response bytea NOT NULL, size bigint NOT NULL,
    created_ns bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS state_compactions (
    id text PRIMARY KEY, summary bytea NOT NULL, conversation text, trace_id text, created_ns bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS state_secrets (name text PRIMARY KEY, value bytea NOT NULL);
CREATE TABLE IF NOT EXISTS erasures (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, at_ns bigint NOT NULL,
                                     who text NOT NULL, kind text NOT NULL, subject text NOT NULL, counts text NOT NULL);
CREATE TABLE IF NOT EXISTS api_keys (name text PRIMARY KEY, tenant text NOT NULL, scopes text NOT NULL, models text,
                                     tokens_per_day bigint, requests_per_minute bigint, digest text NOT NULL UNIQUE,
                                     created_ns bigint NOT NULL, revoked_ns bigint, last_used_ns bigint);
CREATE TABLE IF NOT EXISTS budget_use (name text NOT NULL, kind text NOT NULL, starts bigint NOT NULL,
                                       used bigint NOT NULL, PRIMARY KEY (name, kind, starts));  -- budgets.py
CREATE TABLE IF NOT EXISTS rollouts (key text PRIMARY KEY, grp text, reward double precision, info text,
                                     weight_version text, updated_ns bigint NOT NULL, size bigint);
CREATE TABLE IF NOT EXISTS rollout_rewards (key text NOT NULL, step text NOT NULL, reward double precision NOT NULL,
                                            info text, noted_ns bigint NOT NULL, PRIMARY KEY (key, step));
CREATE TABLE IF NOT EXISTS trainer_logprobs (trace_id text PRIMARY KEY, key text NOT NULL, logprobs bytea NOT NULL,
                                             weight_version text, noted_ns bigint NOT NULL);
ALTER TABLE spans ALTER COLUMN tokens SET STORAGE EXTERNAL;  -- packed and compressed already: stored as it is
ALTER TABLE traces ADD COLUMN IF NOT EXISTS tenant text;  -- version 5: whose request it was (a key's tenant)
ALTER TABLE sessions ADD COLUMN IF NOT EXISTS tenant text;
ALTER TABLE erasures ADD COLUMN IF NOT EXISTS tenant text;  -- the tenant whose erasures list shows it (erasure.py)
CREATE INDEX IF NOT EXISTS traces_by_tenant ON traces (tenant, start_ns) WHERE tenant IS NOT NULL;
CREATE INDEX IF NOT EXISTS sessions_by_tenant ON sessions (tenant, last_ns) WHERE tenant IS NOT NULL;
CREATE INDEX IF NOT EXISTS traces_by_start ON traces (start_ns, trace_id);
CREATE INDEX IF NOT EXISTS traces_by_conversation ON traces (conversation, start_ns);
CREATE INDEX IF NOT EXISTS traces_by_session ON traces (session, start_ns);
CREATE INDEX IF NOT EXISTS traces_by_fork ON traces (fork_of) WHERE fork_of IS NOT NULL;
CREATE INDEX IF NOT EXISTS tool_calls_by_trace ON tool_calls (trace_id);
CREATE INDEX IF NOT EXISTS trace_bases_by_base ON trace_bases (base) WHERE base IS NOT NULL;
CREATE INDEX IF NOT EXISTS trace_text_words ON trace_text USING gin (words);
CREATE INDEX IF NOT EXISTS lost_spans_by_time ON lost_spans (noted_ns);
CREATE INDEX IF NOT EXISTS sessions_by_last ON sessions (last_ns, key);
CREATE INDEX IF NOT EXISTS sessions_by_model ON sessions (model);
CREATE INDEX IF NOT EXISTS sessions_by_client ON sessions (client);
CREATE INDEX IF NOT EXISTS state_conversations_by_time ON state_conversations (updated_ns);
CREATE INDEX IF NOT EXISTS state_turns_by_time ON state_turns (updated_ns);
CREATE INDEX IF NOT EXISTS state_calls_by_conversation ON state_calls (conversation);
CREATE INDEX IF NOT EXISTS state_calls_by_time ON state_calls (noted_ns);
CREATE INDEX IF NOT EXISTS state_responses_by_time ON state_responses (created_ns);
CREATE INDEX IF NOT EXISTS state_compactions_by_time ON state_compactions (created_ns);
CREATE INDEX IF NOT EXISTS rollouts_by_group ON rollouts (grp, updated_ns);
CREATE INDEX IF NOT EXISTS rollouts_by_time ON rollouts (updated_ns);
CREATE INDEX IF NOT EXISTS trainer_logprobs_by_key ON trainer_logprobs (key);
"""

# Version N's statements, run on a database at version N - 1 (after TABLES, which makes new tables).
UPGRADES: dict[int, str] = {
    # The traces that left a conversation's state (state.py), and the prompts stored as what they add.
    2: """ALTER TABLE state_conversations ADD COLUMN IF NOT EXISTS seen_trace text;
          ALTER TABLE state_conversations ADD COLUMN IF NOT EXISTS encoding bigint;
          ALTER TABLE state_conversations ADD COLUMN IF NOT EXISTS digests_trace text;""",
    # How many of a conversation's seen ids are its prompt (token continuity); rollouts' rewards and the
    # trainer's logprobs (trace_store/rollouts.py).
    3: """ALTER TABLE state_conversations ADD COLUMN IF NOT EXISTS seen_prompt bigint;""",
    # What each rollout holds, in bytes: the rollouts are bounded by it (trace_store/rollouts.py).
    4: """ALTER TABLE rollouts ADD COLUMN IF NOT EXISTS size bigint;""",
    # Whose request each trace and session was: TABLES adds the columns (before the indexes on them).
    5: "",
}


def prepare(conn) -> None:
    """Creates the tables, or brings an older database up to this version (its rows stay readable).
    A database written by a newer looptrace is left as it is."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK,))
        conn.execute(TABLES)
        row = conn.execute("SELECT max(version) FROM store_version").fetchone()
        version = row[0] if row and row[0] is not None else None
        if version is None:
            conn.execute("INSERT INTO store_version VALUES (%s)", (VERSION,))
            return
        for step in range(version + 1, VERSION + 1):
            conn.execute(UPGRADES[step])
        if version < VERSION:
            conn.execute("UPDATE store_version SET version = %s", (VERSION,))
