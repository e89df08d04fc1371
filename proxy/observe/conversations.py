"""What observation remembers between the requests of a conversation, and where it is kept.

- what each conversation's model has seen (prompt and output ids), to find what a new request adds;
- the messages of each conversation's last request (a digest each), to find which messages are new;
- tool calls waiting for their result to come back in a later request, to link the two.

A request works through a `Turn`: what its conversation's last request left is read once, ahead
(`begin`, when the request names its conversation, so the read overlaps its preparation), and what
this request leaves is written once: when its answer is complete, before the client hears the end
(so that the next turn finds it, whichever process it lands on), or when it ends otherwise.

`Conversations` keeps all of it in this process's memory, bounded (`--trace-db off`).
`StoredConversations` keeps it in the trace store (trace_store/state.py), so any process serving
that store can take any turn. Its reads and writes run on threads of its own with a deadline, never
on the event loop's time beyond that; while the store does not answer, it serves from its memory
(a copy of what this process wrote) and says so once in the log.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

from opentelemetry.trace import SpanContext, TraceFlags

from looptrace.common.sequences import common_prefix
from looptrace.trace_store.state import MAX_CALLS, MAX_CONVERSATIONS, Recalled, StateStore

log = logging.getLogger("looptrace")

Call = tuple[SpanContext, str]  # the span that made a tool call, and the tool's name
WAIT = 1.0  # seconds a request waits for the store's answer, at most
DOWN_SECONDS = 5.0  # after a store failed to answer, it is not asked again for this long


class Bounded(OrderedDict):
    """A dict that forgets its oldest entries past `size`: memory stays flat however long we run."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def remember(self, key, value) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)


class Conversations:
    """In this process's memory. Used from the rendering threads and the event loop alike, hence the lock."""

    def __init__(self, conversations: int = MAX_CONVERSATIONS, calls: int = MAX_CALLS) -> None:
        self._seen: Bounded = Bounded(conversations)
        self._messages: Bounded = Bounded(conversations)
        self._calls: Bounded = Bounded(calls)
        self._lock = threading.Lock()

    def begin(self, conversation: str | None) -> Turn:
        return Turn(self, conversation, None)

    @staticmethod
    def digest(message: str) -> int:
        return hash(message)  # this process's own hash: the digests never leave it

    def _recall(self, turn: Turn) -> Recalled:
        with self._lock:
            seen, seen_trace, encoding, prompt = self._seen.get(turn.conversation) or (None, None, 0, 0)
            digests, digests_trace = self._messages.get(turn.conversation) or (None, None)
        return Recalled(seen, digests, {}, seen_trace, encoding, digests_trace, prompt)

    def _take(self, turn: Turn, call_ids: list[str]) -> dict[str, Call]:
        with self._lock:
            taken = {call_id: self._calls.pop(call_id) for call_id in call_ids if call_id in self._calls}
        return taken

    def _keep(self, turn: Turn) -> None:
        with self._lock:
            if turn.conversation is not None:
                if turn.digests is not None:
                    self._messages.remember(turn.conversation, (turn.digests, turn.trace_id))
                if turn.seen_now is not None:
                    self._seen.remember(turn.conversation,
                                        (turn.seen_now, turn.trace_id, turn.encoding, turn.prompt_length))
            for call_id, call in turn.expected.items():
                self._calls.remember(call_id, call)

    def close(self) -> None:
        pass


class Turn:
    """One request's view of its conversation (or of none: its tool calls are still linked)."""

    __slots__ = ("owner", "conversation", "_ahead", "_recalled", "answered", "waiting", "digests", "seen_now",
                 "expected", "taken", "_kept", "trace_id", "encoding", "prompt_length", "message_jsons", "_digested")

    def __init__(self, owner: Conversations, conversation: str | None, ahead: Future | None) -> None:
        self.owner, self.conversation, self._ahead = owner, conversation, ahead
        self._recalled: Recalled | None = None
        self.trace_id: str | None = None  # this request's trace, which the next turn's record may build on
        self.encoding = 0  # its prompt's encoding (families/incremental.py), once finished
        self.prompt_length = 0  # how many of seen_now are the prompt
        self.message_jsons: list[str] | None = None  # its messages as JSON, once made (genai.py's shape)
        self._digested: list[str] | None = None  # the JSON `digests` were made of
        self.answered = False  # whether the store answered for the conversation (else: this process's memory)
        self.waiting: dict[str, Call] = {}  # the conversation's calls waiting for results, as the store had them
        self.digests: list[int] | None = None  # this request's messages
        self.seen_now: list[int] | None = None  # what its model saw, once its answer is complete
        self.expected: dict[str, Call] = {}  # calls it made
        self.taken: list[str] = []  # calls whose results it brought
        self._kept = False

    def _recall(self) -> Recalled:
        if self._recalled is None:
            self._recalled = self.owner._recall(self) if self.conversation else Recalled(None, None, {})
        return self._recalled

    def recalled(self) -> Recalled:
        """What the conversation's last turns left, read once."""
        return self._recall()

    def seen(self) -> list[int] | None:
        """The ids the conversation's model saw last (its prompt, then its output)."""
        return self._recall().seen

    def seen_from(self) -> tuple[str | None, int]:
        """The trace that left `seen`, and its prompt's encoding (0: unknown)."""
        recalled = self._recall()
        return recalled.seen_trace, recalled.encoding

    def new_messages_from(self, messages: list[str]) -> tuple[int, str | None]:
        """Where this request's messages (as JSON) stop repeating the last request's, and the trace
        of that last request."""
        if self._digested is not messages:  # asked again for the same messages: digested once
            self.digests = [self.owner.digest(m) for m in messages]
            self._digested = messages
        recalled = self._recall()
        return common_prefix(recalled.digests or [], self.digests), recalled.digests_trace

    def take_results(self, call_ids: list[str]) -> dict[str, Call]:
        """The calls these results answer (their span and tool name), each once."""
        wanted = [c for c in call_ids if c and c not in self.taken]
        found = self.owner._take(self, wanted) if wanted else {}
        self.taken += found
        return found

    def expect_result(self, call_id: str, span: SpanContext, name: str) -> None:
        """A tool call was made; its result will come back in a later request."""
        self.expected[call_id] = (span, name)

    def finish(self, seen: list[int] | None, encoding: int = 0, prompt_length: int = 0) -> None:
        """The answer is complete (its ids, for a conversation, its prompt's encoding and how many of the
        ids are the prompt): kept now, before the client hears the end."""
        self.seen_now, self.encoding, self.prompt_length = seen, encoding, prompt_length
        self.end()

    def end(self) -> None:
        """The request ended: what it leaves is kept, once."""
        if not self._kept:
            self._kept = True
            if self.digests is not None or self.seen_now is not None or self.expected or self.taken:
                self.owner._keep(self)


class StoredConversations(Conversations):
    """In the trace store, shared by every process serving it; this process's memory as a fallback."""

    def __init__(self, state: StateStore) -> None:
        super().__init__()
        self.state = state
        self._pool = ThreadPoolExecutor(4, thread_name_prefix="looptrace-state")
        self._down_until = 0.0

    def begin(self, conversation: str | None) -> Turn:
        ahead = self._pool.submit(self.state.load, conversation) if conversation and self._up() else None
        return Turn(self, conversation, ahead)

    @staticmethod
    def digest(message: str) -> int:
        # The same in every process (str's hash is not): 8 bytes of BLAKE2b, as a signed 64-bit int.
        return int.from_bytes(hashlib.blake2b(message.encode("utf-8", "surrogatepass"), digest_size=8).digest(),
                              "little", signed=True)

    def _recall(self, turn: Turn) -> Recalled:
        if turn._ahead is not None:
            found = self._answer(turn._ahead)
            if found is not None:
                turn.answered = True
                turn.waiting = {call_id: (_context(trace_id, span_id), name)
                                for call_id, (trace_id, span_id, name) in found.calls.items()}
                return found
        return super()._recall(turn)

    def _take(self, turn: Turn, call_ids: list[str]) -> dict[str, Call]:
        local = super()._take(turn, call_ids)  # this process's copy forgets them either way
        stored = None
        if turn.conversation:
            turn._recall()  # the conversation's waiting calls came with its state
            stored = turn.waiting if turn.answered else None
        elif self._up():
            found = self._answer(self._pool.submit(self.state.calls, call_ids))
            if found is not None:
                stored = {call_id: (_context(trace_id, span_id), name)
                          for call_id, (trace_id, span_id, name) in found.items()}
        if stored is None:  # the store did not answer: what this process knows
            return local
        return {c: stored[c] for c in call_ids if c in stored}

    def _keep(self, turn: Turn) -> None:
        super()._keep(turn)
        if not self._up():
            return
        expected = {call_id: (format(span.trace_id, "032x"), format(span.span_id, "016x"), name)
                    for call_id, (span, name) in turn.expected.items()}
        self._answer(self._pool.submit(self.state.save, turn.conversation, seen=turn.seen_now, digests=turn.digests,
                                       expected=expected, taken=turn.taken, trace_id=turn.trace_id,
                                       encoding=turn.encoding, seen_prompt=turn.prompt_length))

    def _up(self) -> bool:
        return time.monotonic() >= self._down_until

    def _answer(self, future: Future):
        """The store's answer within WAIT, or None (and the store is left alone for a while)."""
        try:
            return future.result(WAIT)
        except Exception as exc:  # noqa: BLE001 - a store that does not answer must not fail a request
            if self._up():
                log.warning("conversation state in %s does not answer (%s): serving from this process's memory "
                            "for %g s", self.state.where, str(exc).strip() or type(exc).__name__, DOWN_SECONDS)
            self._down_until = time.monotonic() + DOWN_SECONDS
            return None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.state.close()


def _context(trace_id: str, span_id: str) -> SpanContext:
    return SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
