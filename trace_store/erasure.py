"""Erasing a subject's data: one session, every session of a tenant, or everything before a date.

What a session leaves is spread over the store: its traces' rows (spans, traces, trace_text, tool_calls,
trace_bases, lost_spans, sessions) and, in the state beside them, its conversation's last turn and
digests, its tool calls waiting, its stored Responses responses, its compaction summaries and its
rollout's rows. `pick` finds the traces (in a temporary table `doomed`) and what links the state to
them; the store deletes the traces' rows (sqlite/store.py, postgres/store.py); `state_statements` are
the state's deletions. A stored response is linked to its session by the span that answered it
(`gen_ai.response.id` on the request's span): the state's row holds no session of its own.

Erasing a session or a tenant takes every step built on an erased one too (a fork, a later step
stored as what it adds): each holds the erased text. Erasing by date keeps the later steps, made
whole first (chains.py), as retention does.

SQLite's bytes leave the files too: the FTS index is merged without the erased words ('optimize'), the
file rebuilt (VACUUM: a deleted row's bytes otherwise stay in free pages and in the free space of the
pages kept, and an earlier UPDATE's old cell too) and the write-ahead log checkpointed and truncated.
PostgreSQL deletes the rows; its own VACUUM frees their space later.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

from looptrace.common import attributes as attr

KINDS = ("session", "tenant", "before")
CHUNK = 500  # values per IN (…) list: under SQLite's variable limit
TRIES = 10  # attempts at the state's deletions


@dataclass(frozen=True, slots=True)
class Subject:
    kind: str  # one of KINDS
    value: str  # the session key, the tenant, or the date as given
    before_ns: int | None = None  # for "before"
    tenant: str | None = None  # a session erased within this tenant's traces alone: a tenant's key's (the API's)

    @staticmethod
    def before(value: str) -> "Subject":
        """`--before DATE`: an ISO 8601 date or time (a zone, else UTC), or Unix seconds."""
        try:
            seconds = float(value)
        except ValueError:
            try:
                moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                raise ValueError(f"--before {value!r}: not an ISO 8601 date or time, nor Unix seconds") from None
            seconds = (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()
        if not 0 <= seconds < 9.2e9:
            raise ValueError(f"--before {value!r}: not a time between 1970 and 2262")
        return Subject("before", value, int(seconds * 1e9))


@dataclass(slots=True)
class Found:
    """What the trace side removed, for the state side to follow."""

    traces: list[str] = field(default_factory=list)
    conversations: list[str] = field(default_factory=list)  # none of whose traces is left
    sessions: list[str] = field(default_factory=list)  # likewise: their rollouts go
    responses: list[str] = field(default_factory=list)  # stored responses the removed traces answered with
    counts: dict[str, int] = field(default_factory=dict)


# The response id on a span's attributes (JSON text), in each store's SQL.
RESPONSE_ID = {"sqlite": f"json_extract(attributes, '$.\"{attr.GEN_AI_RESPONSE_ID}\"')",
               "postgresql": f"(attributes::jsonb) ->> '{attr.GEN_AI_RESPONSE_ID}'"}


def _column(rows) -> list:
    return [r[0] for r in rows]


def pick(db, subject: Subject) -> None:
    """Fills the temporary table `doomed` (made by the caller) with the subject's traces: for a session
    or a tenant, with every step built on one of them or forked from one, until none is left."""
    if subject.kind == "before":
        db.execute("INSERT INTO doomed SELECT trace_id FROM traces WHERE start_ns < ?", (subject.before_ns,))
        db.execute("INSERT INTO doomed SELECT trace_id FROM lost_spans WHERE noted_ns < ? "
                   "AND trace_id NOT IN (SELECT trace_id FROM doomed)", (subject.before_ns,))
        return
    column = "session" if subject.kind == "session" else "tenant"
    if column == "tenant":
        try:
            db.execute("SELECT tenant FROM traces WHERE 1 = 0").fetchall()
        except Exception as exc:  # noqa: BLE001 - either driver's "no such column"
            raise ValueError("--tenant: this store's traces have no tenant (a looptrace with keys records "
                             "one; older traces belong to none)") from exc
    if subject.tenant is not None:  # another tenant's traces of that session key are not the caller's to erase
        db.execute("INSERT INTO doomed SELECT trace_id FROM traces WHERE session = ? AND tenant = ?",
                   (subject.value, subject.tenant))
    else:
        db.execute(f"INSERT INTO doomed SELECT trace_id FROM traces WHERE {column} = ?", (subject.value,))
    while db.execute("""INSERT INTO doomed SELECT DISTINCT trace_id FROM (
                            SELECT trace_id FROM traces WHERE fork_of IN (SELECT trace_id FROM doomed)
                            UNION SELECT trace_id FROM trace_bases WHERE base IN (SELECT trace_id FROM doomed)) t
                        WHERE trace_id NOT IN (SELECT trace_id FROM doomed)""").rowcount > 0:
        pass


def by_key(db, subject: Subject) -> bool:
    """Whether a session's erasure takes its row and its state by its key too, besides its traces' (they
    may have gone before): the operator's does; a tenant's only where the row is the tenant's, so that
    another tenant's session is left whole, erased exactly as one never stored. Read before the deletion."""
    if subject.kind != "session":
        return False
    if subject.tenant is None:
        return True
    row = db.execute("SELECT tenant FROM sessions WHERE key = ?", (subject.value,)).fetchone()
    return row is not None and row[0] == subject.tenant


def linked(db, kind: str) -> Found:
    """What the traces in `doomed` link to, read before they are deleted."""
    found = Found(traces=_column(db.execute("SELECT trace_id FROM doomed").fetchall()))
    found.conversations = _column(db.execute(
        "SELECT DISTINCT conversation FROM traces WHERE trace_id IN (SELECT trace_id FROM doomed) "
        "AND conversation IS NOT NULL").fetchall())
    found.sessions = _column(db.execute(
        "SELECT DISTINCT session FROM traces WHERE trace_id IN (SELECT trace_id FROM doomed) "
        "AND session IS NOT NULL").fetchall())
    found.responses = [r for r in _column(db.execute(
        f"SELECT DISTINCT {RESPONSE_ID[kind]} FROM spans WHERE trace_id IN (SELECT trace_id FROM doomed)").fetchall())
        if r]
    return found


def gone(db, found: Found) -> None:
    """After the deletion: only the conversations and sessions none of whose traces is left."""
    found.conversations = [c for c in found.conversations
                           if db.execute("SELECT 1 FROM traces WHERE conversation = ? LIMIT 1", (c,)).fetchone() is None]
    found.sessions = [s for s in found.sessions
                      if db.execute("SELECT 1 FROM traces WHERE session = ? LIMIT 1", (s,)).fetchone() is None]


def _in(values: list[str]):
    for start in range(0, len(values), CHUNK):
        chunk = values[start:start + CHUNK]
        yield f"({','.join('?' * len(chunk))})", tuple(chunk)


# (table, column, which of Found's lists): the state rows that go with the traces.
STATE_LINKS = (
    ("state_conversations", "key", "conversations"), ("state_turns", "key", "conversations"),
    ("state_calls", "conversation", "conversations"), ("state_calls", "trace_id", "traces"),
    ("state_compactions", "conversation", "conversations"), ("state_compactions", "trace_id", "traces"),
    ("state_responses", "id", "responses"),
    ("trainer_logprobs", "trace_id", "traces"), ("trainer_logprobs", "key", "sessions"),
    ("rollout_rewards", "key", "sessions"), ("rollouts", "key", "sessions"),
)
# What a date erases of the state by its own time, whatever its traces (a response outlives its trace).
STATE_TIMES = (("state_conversations", "updated_ns"), ("state_turns", "updated_ns"), ("state_calls", "noted_ns"),
               ("state_responses", "created_ns"), ("state_compactions", "created_ns"), ("rollouts", "updated_ns"),
               ("rollout_rewards", "noted_ns"), ("trainer_logprobs", "noted_ns"))


def state_statements(found: Found, before_ns: int | None = None) -> list[tuple[str, str, tuple]]:
    """(table, DELETE with `?` placeholders, args): the state rows of what `found` removed."""
    statements = []
    for table, column, which in STATE_LINKS:
        for placeholders, args in _in(getattr(found, which)):
            statements.append((table, f"DELETE FROM {table} WHERE {column} IN {placeholders}", args))
    if before_ns is not None:
        statements += [(table, f"DELETE FROM {table} WHERE {column} < ?", (before_ns,)) for table, column in STATE_TIMES]
        statements += [(table, f"DELETE FROM {table} WHERE key NOT IN (SELECT key FROM rollouts)", ())
                       for table in ("rollout_rewards", "trainer_logprobs")]
    return statements


def forget(state, found: Found, before_ns: int | None = None) -> dict[str, int]:
    """The state's rows of what `found` removed, in one transaction; how many of each table's."""
    statements = state_statements(found, before_ns)
    counts: dict[str, int] = {}
    if statements:
        for (table, _, _), count in zip(statements, state._write([(sql, args) for _, sql, args in statements])):
            counts[table] = counts.get(table, 0) + max(count, 0)
    return counts


def record(state, who: str, subject: Subject, counts: dict[str, int]) -> None:
    """The erasure itself, in the state's `erasures`: who, what, when and how many rows, never content;
    and the tenant whose list shows it (the erasing key's, or the tenant erased; else only the operator's)."""
    tenant = subject.tenant if subject.tenant is not None else subject.value if subject.kind == "tenant" else None
    state._write([("INSERT INTO erasures (at_ns, who, kind, subject, counts, tenant) VALUES (?, ?, ?, ?, ?, ?)",
                   (time.time_ns(), who, subject.kind, subject.value, json.dumps(counts, sort_keys=True), tenant))])


def erasures(state, limit: int = 100, tenant: str | None = None) -> list[dict]:
    """The erasures made, newest first: with `tenant`, those its list shows alone."""
    where, args = ("WHERE tenant = ? ", (tenant,)) if tenant is not None else ("", ())
    (rows,) = state._read([(f"SELECT at_ns, who, kind, subject, counts FROM erasures {where}ORDER BY at_ns DESC "
                            "LIMIT ?", (*args, limit))])
    return [{"at_ns": r[0], "who": r[1], "kind": r[2], "subject": r[3], "counts": json.loads(r[4])} for r in rows]


def erase(store, state, subject: Subject, who: str) -> dict:
    """Everything of `subject`: the traces (the store's `erase`, its bytes out of the files), then the
    state's rows, then the erasure recorded. What was removed, by table."""
    found = store.erase(subject)
    counts = {table: n for table, n in found.counts.items() if n}
    for attempt in range(TRIES):  # the traces are gone: what links the state to them is only in `found` now
        try:
            forgotten = forget(state, found, subject.before_ns)
            break
        except OSError:  # a server's write holding the state's file past its wait (1 s): again, a little later
            if attempt == TRIES - 1:
                raise
            time.sleep(1.0)
    for table, n in forgotten.items():
        if n:
            counts[table] = counts.get(table, 0) + n
    record(state, who, subject, counts)
    scrub = getattr(state, "scrub", None)
    if scrub is not None:
        scrub()
    return {"kind": subject.kind, "subject": subject.value, "who": who, "removed": counts,
            "responses": found.responses}
