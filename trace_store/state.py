"""What any process needs to serve a conversation's next turn, kept in the store beside the traces.

    state_turns          each conversation's last turn as its model read and wrote it: the prompt and
                         sampled ids, and what the turn was asked and answered, as digests (the
                         engine's memory: proxy/engine/memory.py, for token continuity and the part of
                         the next prompt that is new)
    state_conversations  each conversation's last messages' digests (which messages are new, for its
                         trace); its `seen` columns are no longer written (state_turns holds those ids)
    state_calls          tool calls waiting for their result to come back in a later request
    state_responses      stored Responses (`previous_response_id`, GET / DELETE /v1/responses/{id})
    state_compactions    the summaries compactions wrote, which a `compaction` item names (its reference)
    state_secrets        keys every process serving the store shares (the one compaction references are signed with)

Bounded as the in-memory versions are (proxy/engine/memory.py, proxy/observe/conversations.py,
proxy/api/openai/responses/store.py): the newest conversations, calls and responses are kept, the oldest deleted as new
ones come. Per request, one round trip for each owner and direction (the engine's memory, then
observation's state; the two reads run at once), never one per token: each is read in one query (ids
packed: 4 bytes a token) and written in one transaction.

What holds a client's text (a turn's ids, a stored response and its conversation, a compaction's
summary) is sealed at rest (trace_store/sealing.py): the model gets the real text back next turn,
so redaction cannot apply there, and a copy of the files alone reads none of it.

SQLite keeps these in a file of their own beside the traces (`traces.state.sqlite3`): the trace
writer holds the traces file's one write lock for whole batches (and retention for longer), and a
request must not wait behind it. PostgreSQL keeps them in the store's database (postgres/schema.py).
"""

from __future__ import annotations

import logging
import time
import zlib
from array import array
from typing import NamedTuple

from .records import storable
from .sealing import Sealer, this_hosts_sealer

log = logging.getLogger("looptrace")

MAX_CONVERSATIONS = 1024
MAX_CALLS = 8192
MAX_COMPACTIONS = 4096  # summaries kept; a reference to one pruned since is refused as expired
PRUNE_EVERY = 64  # conversations and calls are trimmed to their bound every this many writes
COMPRESS_FROM = 1024  # a stored response's JSON is compressed past this size


# A conversation's messages' digests are saved with the trace whose messages they are (the next turn's
# messages are stored as what they add to that trace's: proxy/observe/request_spans.py).
SAVE_CONVERSATION = """
INSERT INTO state_conversations AS c (key, digests, updated_ns, digests_trace) VALUES (?, ?, ?, ?)
ON CONFLICT (key) DO UPDATE SET digests = excluded.digests, updated_ns = excluded.updated_ns,
                                digests_trace = excluded.digests_trace"""
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

SAVE_TURN = """
INSERT INTO state_turns AS t (key, ids, prompt_length, encoding, label, digests, updated_ns) VALUES (?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (key) DO UPDATE SET ids = excluded.ids, prompt_length = excluded.prompt_length,
    encoding = excluded.encoding, label = excluded.label, digests = excluded.digests, updated_ns = excluded.updated_ns"""

Call = tuple[str, str, str]  # (trace id, span id, tool name) of the span that made a call
# A conversation's last turn: its ids (prompt, then sampled), how many are the prompt, the prompt's
# encoding, the request that left it, and its digests packed (proxy/engine/turn_digests.py).
Turn = tuple[list[int], int, int, str | None, bytes | None]


class Recalled(NamedTuple):
    """A conversation's state as its last turns left it (None where nothing was saved)."""

    digests: list[int] | None  # its last request's messages, a digest each
    calls: dict[str, Call]  # its tool calls waiting for their results
    digests_trace: str | None = None  # the trace that left `digests`


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
        self._writes = self._turn_writes = 0
        self._sealer: Sealer | None = None
        self._said_unopened = False

    @property
    def sealer(self) -> Sealer:
        if self._sealer is None:  # made when first used: opening a store for its traces reads no secret
            self._sealer = this_hosts_sealer()
        return self._sealer

    def _open(self, data: bytes, table: str, key: str) -> bytes | None:
        """A sealed record's bytes, or None where it does not open: read as unknown, said once."""
        opened = self.sealer.open(data, table, key)
        if opened is None and not self._said_unopened:
            self._said_unopened = True
            log.warning("records in the state store at %s were sealed under another key secret (or moved) and read "
                        "as unknown: set LOOPTRACE_KEY_SECRET to the secret of the server that wrote them",
                        self.where)
        return opened

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
        """A conversation's last messages' digests (with the trace that left them), and its calls waiting
        for results."""
        rows, calls = self._read([
            ("SELECT digests, digests_trace FROM state_conversations WHERE key = ?", (key,)),
            ("SELECT call_id, trace_id, span_id, name FROM state_calls WHERE conversation = ?", (key,))])
        waiting = {c[0]: (c[1], c[2], c[3]) for c in calls}
        if not rows:
            return Recalled(None, waiting)
        digests, digests_trace = rows[0]
        return Recalled(unpack_digests(digests), waiting, digests_trace)

    def calls(self, call_ids: list[str]) -> dict[str, Call]:
        """Waiting calls by id, whatever their conversation (a request that names none)."""
        if not call_ids:
            return {}
        (rows,) = self._read([(f"SELECT call_id, trace_id, span_id, name FROM state_calls WHERE call_id IN "
                               f"({','.join('?' * len(call_ids))})", tuple(call_ids))])
        return {r[0]: (r[1], r[2], r[3]) for r in rows}

    def save(self, key: str | None, *, digests: list[int] | None, expected: dict[str, Call], taken: list[str],
             trace_id: str | None = None) -> None:
        """One request's changes, in one transaction: its messages' digests, left by its trace `trace_id`,
        the calls it made (waiting now) and the calls whose results it brought (waiting no more)."""
        now = time.time_ns()
        statements = []
        if key is not None and digests is not None:
            statements.append((SAVE_CONVERSATION, (key, pack_digests(digests), now, trace_id)))
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

    def load_turn(self, key: str) -> Turn | None:
        """A conversation's last turn, as the engine left it (None: none kept)."""
        (rows,) = self._read([("SELECT ids, prompt_length, encoding, label, digests FROM state_turns WHERE key = ?",
                               (key,))])
        if not rows:
            return None
        ids, prompt_length, encoding, label, digests = rows[0]
        if (ids := self._open(ids, "state_turns", key)) is None:
            return None
        return unpack_ids(ids), prompt_length, encoding or 0, label, None if digests is None else bytes(digests)

    def save_turn(self, key: str, ids: list[int], prompt_length: int, encoding: int, label: str | None,
                  digests: bytes | None) -> None:
        """A conversation's last turn, in place of the one before (one transaction)."""
        sealed = self.sealer.seal(pack_ids(ids), "state_turns", key)
        statements = [(SAVE_TURN, (key, sealed, prompt_length, encoding, label, digests, time.time_ns()))]
        self._turn_writes += 1
        if self._turn_writes % PRUNE_EVERY == 1 % PRUNE_EVERY:  # the first write, then every PRUNE_EVERY-th
            statements.append((PRUNE.format(table="state_turns", key="key", time="updated_ns", all=self.ALL),
                               (MAX_CONVERSATIONS,)))
        self._write(statements)

    def put_response(self, response_id: str, conversation: str, response: str, size: int, *, max_responses: int,
                     max_bytes: int) -> None:
        self._write([
            ("INSERT INTO state_responses VALUES (?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
             "conversation = excluded.conversation, response = excluded.response, size = excluded.size, "
             "created_ns = excluded.created_ns",
             (response_id, self._seal_response(response_id, "conversation", conversation),
              self._seal_response(response_id, "response", response), size, time.time_ns())),
            (PRUNE.format(table="state_responses", key="id", time="created_ns", all=self.ALL), (max_responses,)),
            (PRUNE_BYTES, (max_bytes,))])

    def _seal_response(self, response_id: str, column: str, text: str) -> bytes:
        # The column in the associated data too: a response's two records cannot be swapped.
        return self.sealer.seal(pack_json(text), "state_responses", f"{response_id}\0{column}")

    def get_response(self, response_id: str, part: str) -> str | None:
        """A stored response's `conversation` (its items and output) or `response`, as JSON."""
        column = {"conversation": "conversation", "response": "response"}[part]
        (rows,) = self._read([(f"SELECT {column} FROM state_responses WHERE id = ?", (response_id,))])
        found = self._open(rows[0][0], "state_responses", f"{response_id}\0{column}") if rows else None
        return None if found is None else unpack_json(found)

    def delete_response(self, response_id: str) -> bool:
        return self._write([("DELETE FROM state_responses WHERE id = ?", (response_id,))])[0] > 0

    def put_compaction(self, compaction_id: str, summary: str, conversation: str | None, trace_id: str | None) -> None:
        self._write([
            ("INSERT INTO state_compactions VALUES (?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
             (compaction_id, self.sealer.seal(pack_json(summary), "state_compactions", compaction_id), conversation,
              trace_id, time.time_ns())),
            (PRUNE.format(table="state_compactions", key="id", time="created_ns", all=self.ALL), (MAX_COMPACTIONS,))])

    def get_compaction(self, compaction_id: str) -> str | None:
        """A compaction's summary, or None: never written, or pruned since."""
        (rows,) = self._read([("SELECT summary FROM state_compactions WHERE id = ?", (compaction_id,))])
        found = self._open(rows[0][0], "state_compactions", compaction_id) if rows else None
        return None if found is None else unpack_json(found)

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


