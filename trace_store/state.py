"""What any process needs to serve a conversation's next turn, kept in the store beside the traces.

    state_conversations  each conversation's last prompt and answer ids (what its model has seen, for
                         the part of the next prompt that is new and the prompt diff) and its last
                         messages' digests (which messages are new)
    state_calls          tool calls waiting for their result to come back in a later request
    state_responses      stored Responses (`previous_response_id`, GET / DELETE /v1/responses/{id})
    state_compactions    the summaries compactions wrote, which a `compaction` item names (its reference)
    state_secrets        keys every process serving the store shares (the one compaction references are signed with)

Bounded as the in-memory versions are (proxy/observe/conversations.py, response_store.py): the
newest conversations, calls and responses are kept, the oldest deleted as new ones come. One round
trip per request for each direction, never one per token: a conversation's state is read in one
query (ids packed: 4 bytes a token) and written in one transaction.

SQLite keeps these in a file of their own beside the traces (`traces.state.sqlite3`): the trace
writer holds the traces file's one write lock for whole batches (and retention for longer), and a
request must not wait behind it. PostgreSQL keeps them in the store's database (postgres/schema.py).
"""

from __future__ import annotations

import time
import zlib
from array import array
from typing import NamedTuple

from .records import storable

MAX_CONVERSATIONS = 1024
MAX_CALLS = 8192
MAX_COMPACTIONS = 4096  # summaries kept; a reference to one pruned since is refused as expired
PRUNE_EVERY = 64  # conversations and calls are trimmed to their bound every this many writes
COMPRESS_FROM = 1024  # a stored response's JSON is compressed past this size


# A conversation's seen ids are saved with the trace that left them and its prompt's encoding (the
# next turn's prompt is stored as what it adds to that trace's: proxy/observe/request_spans.py), its
# messages' digests with the trace whose messages they are; either pair may be saved alone.
SAVE_CONVERSATION = """
INSERT INTO state_conversations AS c (key, seen, digests, updated_ns, seen_trace, encoding, digests_trace,
                                      seen_prompt)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (key) DO UPDATE SET
    seen = coalesce(excluded.seen, c.seen), digests = coalesce(excluded.digests, c.digests),
    updated_ns = excluded.updated_ns,
    seen_trace = CASE WHEN excluded.seen IS NULL THEN c.seen_trace ELSE excluded.seen_trace END,
    encoding = CASE WHEN excluded.seen IS NULL THEN c.encoding ELSE excluded.encoding END,
    seen_prompt = CASE WHEN excluded.seen IS NULL THEN c.seen_prompt ELSE excluded.seen_prompt END,
    digests_trace = CASE WHEN excluded.digests IS NULL THEN c.digests_trace ELSE excluded.digests_trace END"""
SAVE_CALL = """
INSERT INTO state_calls AS c VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (call_id) DO UPDATE SET conversation = excluded.conversation, trace_id = excluded.trace_id,
                                    span_id = excluded.span_id, name = excluded.name, noted_ns = excluded.noted_ns"""
# What lies past a table's newest `?` rows (LIMIT -1: none, in SQLite; PostgreSQL's is ALL).
PRUNE = "DELETE FROM {table} WHERE {key} IN (SELECT {key} FROM {table} ORDER BY {time} DESC LIMIT {all} OFFSET ?)"
# Responses past the newest that fit in `?` bytes together.
PRUNE_BYTES = """
DELETE FROM state_responses WHERE id IN (SELECT id FROM (
    SELECT id, sum(size) OVER (ORDER BY created_ns DESC, id DESC) AS total FROM state_responses) t WHERE total > ?)"""

Call = tuple[str, str, str]  # (trace id, span id, tool name) of the span that made a call


class Recalled(NamedTuple):
    """A conversation's state as its last turns left it (None where nothing was saved)."""

    seen: list[int] | None  # the ids its model saw last: prompt, then answer
    digests: list[int] | None  # its last request's messages, a digest each
    calls: dict[str, Call]  # its tool calls waiting for their results
    seen_trace: str | None = None  # the trace that left `seen`
    encoding: int = 0  # that trace's prompt's encoding (families/incremental.py), 0: unknown
    digests_trace: str | None = None  # the trace that left `digests`
    seen_prompt: int = 0  # how many of `seen` are the prompt (the rest its model wrote); 0: unknown


def pack_ids(ids: list[int]) -> bytes:
    return array("i", ids).tobytes()


def unpack_ids(data: bytes | None) -> list[int] | None:
    return None if data is None else array("i", bytes(data)).tolist()


def pack_digests(digests: list[int]) -> bytes:
    return array("q", digests).tobytes()


def unpack_digests(data: bytes | None) -> list[int] | None:
    return None if data is None else array("q", bytes(data)).tolist()


def pack_json(text: str) -> bytes:
    data = text.encode()
    return b"z" + zlib.compress(data, 1) if len(data) > COMPRESS_FROM else b"j" + data


def unpack_json(data: bytes) -> str:
    data = bytes(data)
    return (zlib.decompress(data[1:]) if data[:1] == b"z" else data[1:]).decode()


class StateStore:
    """The queries, with `?` placeholders. A subclass runs a list of statements as one read
    (`_read`: each statement's rows) or one transaction (`_write`: each statement's row count):
    one round trip each where the database is across a network."""

    ALL = "-1"  # LIMIT's "no limit"
    where = "?"

    def __init__(self) -> None:
        self._writes = 0

    def _read(self, statements: list[tuple[str, tuple]]) -> list[list]:
        raise NotImplementedError

    def _write(self, statements: list[tuple[str, tuple]]) -> list[int]:
        raise NotImplementedError

    @staticmethod
    def _storable(statements: list[tuple[str, tuple]]) -> list[tuple[str, tuple]]:
        """Keys a client sent (a conversation id from a header, a tool call's id, a response id in a
        path) as the store can hold them: one that could not be bound would fail the store for all."""
        return [(sql, tuple(storable(a) if type(a) is str else a for a in args)) for sql, args in statements]

    def load(self, key: str) -> Recalled:
        """A conversation's seen ids and last messages' digests (with the traces that left them), and
        its calls waiting for results."""
        rows, calls = self._read([
            ("SELECT seen, digests, seen_trace, encoding, digests_trace, seen_prompt FROM state_conversations "
             "WHERE key = ?", (key,)),
            ("SELECT call_id, trace_id, span_id, name FROM state_calls WHERE conversation = ?", (key,))])
        waiting = {c[0]: (c[1], c[2], c[3]) for c in calls}
        if not rows:
            return Recalled(None, None, waiting)
        seen, digests, seen_trace, encoding, digests_trace, seen_prompt = rows[0]
        return Recalled(unpack_ids(seen), unpack_digests(digests), waiting, seen_trace, encoding or 0, digests_trace,
                        seen_prompt or 0)

    def calls(self, call_ids: list[str]) -> dict[str, Call]:
        """Waiting calls by id, whatever their conversation (a request that names none)."""
        if not call_ids:
            return {}
        (rows,) = self._read([(f"SELECT call_id, trace_id, span_id, name FROM state_calls WHERE call_id IN "
                               f"({','.join('?' * len(call_ids))})", tuple(call_ids))])
        return {r[0]: (r[1], r[2], r[3]) for r in rows}

    def save(self, key: str | None, *, seen: list[int] | None, digests: list[int] | None,
             expected: dict[str, Call], taken: list[str], trace_id: str | None = None, encoding: int = 0,
             seen_prompt: int = 0) -> None:
        """One request's changes, in one transaction: what its model saw (and the encoding of its
        prompt, and how many of the ids are the prompt), its messages' digests, both left by its trace
        `trace_id`, the calls it made (waiting now) and the calls whose results it brought (waiting no more)."""
        now = time.time_ns()
        statements = []
        if key is not None and (seen is not None or digests is not None):
            statements.append((SAVE_CONVERSATION, (
                key, None if seen is None else pack_ids(seen), None if digests is None else pack_digests(digests),
                now, trace_id if seen is not None else None, encoding if seen is not None else None,
                trace_id if digests is not None else None, seen_prompt if seen is not None else None)))
        if taken:
            statements.append((f"DELETE FROM state_calls WHERE call_id IN ({','.join('?' * len(taken))})",
                               tuple(taken)))
        for call_id, (trace_id, span_id, name) in sorted(expected.items()):
            statements.append((SAVE_CALL, (call_id, key, trace_id, span_id, name, now)))
        if not statements:
            return
        self._writes += 1
        if self._writes % PRUNE_EVERY == 1 % PRUNE_EVERY:  # the first write, then every PRUNE_EVERY-th
            statements += [(PRUNE.format(table="state_conversations", key="key", time="updated_ns", all=self.ALL),
                            (MAX_CONVERSATIONS,)),
                           (PRUNE.format(table="state_calls", key="call_id", time="noted_ns", all=self.ALL),
                            (MAX_CALLS,))]
        self._write(statements)

    def put_response(self, response_id: str, conversation: str, response: str, size: int, *, max_responses: int,
                     max_bytes: int) -> None:
        self._write([
            ("INSERT INTO state_responses VALUES (?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
             "conversation = excluded.conversation, response = excluded.response, size = excluded.size, "
             "created_ns = excluded.created_ns",
             (response_id, pack_json(conversation), pack_json(response), size, time.time_ns())),
            (PRUNE.format(table="state_responses", key="id", time="created_ns", all=self.ALL), (max_responses,)),
            (PRUNE_BYTES, (max_bytes,))])

    def get_response(self, response_id: str, part: str) -> str | None:
        """A stored response's `conversation` (its items and output) or `response`, as JSON."""
        column = {"conversation": "conversation", "response": "response"}[part]
        (rows,) = self._read([(f"SELECT {column} FROM state_responses WHERE id = ?", (response_id,))])
        return unpack_json(rows[0][0]) if rows else None

    def delete_response(self, response_id: str) -> bool:
        return self._write([("DELETE FROM state_responses WHERE id = ?", (response_id,))])[0] > 0

    def put_compaction(self, compaction_id: str, summary: str, conversation: str | None, trace_id: str | None) -> None:
        self._write([
            ("INSERT INTO state_compactions VALUES (?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
             (compaction_id, pack_json(summary), conversation, trace_id, time.time_ns())),
            (PRUNE.format(table="state_compactions", key="id", time="created_ns", all=self.ALL), (MAX_COMPACTIONS,))])

    def get_compaction(self, compaction_id: str) -> str | None:
        """A compaction's summary, or None: never written, or pruned since."""
        (rows,) = self._read([("SELECT summary FROM state_compactions WHERE id = ?", (compaction_id,))])
        return unpack_json(rows[0][0]) if rows else None

    def secret(self, name: str, made: bytes) -> bytes:
        """The key called `name` that every process serving this store shares: `made` when none was kept
        yet (the first process to ask keeps its own), else the one kept; a restart finds it again."""
        self._write([("INSERT INTO state_secrets VALUES (?, ?) ON CONFLICT (name) DO NOTHING", (name, made))])
        (rows,) = self._read([("SELECT value FROM state_secrets WHERE name = ?", (name,))])
        return bytes(rows[0][0])

    def count_responses(self) -> tuple[int, int]:
        (rows,) = self._read([("SELECT count(*), coalesce(sum(size), 0) FROM state_responses", ())])
        return rows[0][0], rows[0][1]

    def close(self) -> None:
        pass


