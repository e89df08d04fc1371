"""What observation remembers between the requests of a conversation, and where it is kept.

- the messages of each conversation's last request (a digest each), to find which messages are new;
- tool calls waiting for their result to come back in a later request, to link the two.

Each conversation's last messages (their JSON) are kept here too, bounded by bytes, with their
digests: a message whose text is the one kept at its place takes the kept digest (the same text, the
same digest), so that a long session's turn digests what it adds, not its whole history again.

What each conversation's model read and sampled is the engine's memory (proxy/engine/memory.py), which
observers read from the generation they watch and never write.

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

import threading
from concurrent.futures import Future

from opentelemetry.trace import SpanContext, TraceFlags

from looptrace.common.byte_bounded import ByteBounded
from looptrace.common.sequences import common_prefix
from looptrace.trace_store.state import MAX_CALLS, MAX_CONVERSATIONS, Recalled, StateStore

from ..engine.memory import Bounded
from ..engine.state_calls import UNANSWERED, StateCalls
from ..engine.turn_digests import digest

Call = tuple[SpanContext, str]  # the span that made a tool call, and the tool's name
MAX_DIGESTED_BYTES = 64 << 20  # the messages' JSON kept to digest only what is new (about: 4 bytes a character)


class Conversations:
    """In this process's memory. Used from the rendering threads and the event loop alike, hence the lock."""

    def __init__(self, conversations: int = MAX_CONVERSATIONS, calls: int = MAX_CALLS) -> None:
        self._messages: Bounded = Bounded(conversations)
        self._calls: Bounded = Bounded(calls)
        self._lock = threading.Lock()
        self._digested: ByteBounded[tuple[list[str], list[int]]] = ByteBounded(MAX_DIGESTED_BYTES)

    def begin(self, conversation: str | None) -> Turn:
        return Turn(self, conversation, None)

    @staticmethod
    def digest(message: str) -> int:
        return hash(message)  # this process's own hash: the digests never leave it

    def digests(self, conversation: str | None, messages: list[str]) -> list[int]:
        """A digest for each message (as JSON): the kept one where the conversation's last messages had
        the same text at the same place, else made."""
        kept_texts, kept = (self._digested.get(conversation) if conversation is not None else None) or ((), ())
        n = len(kept_texts)
        digests = [kept[i] if i < n and kept_texts[i] == m else self.digest(m) for i, m in enumerate(messages)]
        if conversation is not None:
            self._digested.put(conversation, (messages, digests), 4 * sum(map(len, messages)) + 16 * len(digests))
        return digests

    def _recall(self, turn: Turn) -> Recalled:
        with self._lock:
            digests, digests_trace = self._messages.get(turn.conversation) or (None, None)
        return Recalled(digests, {}, digests_trace)

    def _take(self, turn: Turn, call_ids: list[str]) -> dict[str, Call]:
        with self._lock:
            taken = {call_id: self._calls.pop(call_id) for call_id in call_ids if call_id in self._calls}
        return taken

    def _keep(self, turn: Turn) -> None:
        with self._lock:
            if turn.conversation is not None:
                if turn.digests is not None:
                    self._messages.remember(turn.conversation, (turn.digests, turn.trace_id))
            for call_id, call in turn.expected.items():
                self._calls.remember(call_id, call)

    def close(self) -> None:
        pass


class Turn:
    """One request's view of its conversation (or of none: its tool calls are still linked)."""

    __slots__ = ("owner", "conversation", "_ahead", "_recalled", "answered", "waiting", "digests", "expected",
                 "taken", "_kept", "trace_id", "_digested")

    def __init__(self, owner: Conversations, conversation: str | None, ahead: Future | None) -> None:
        self.owner, self.conversation, self._ahead = owner, conversation, ahead
        self._recalled: Recalled | None = None
        self.trace_id: str | None = None  # this request's trace, which the next turn's record may build on
        self._digested: list[str] | None = None  # the JSON `digests` were made of
        self.answered = False  # whether the store answered for the conversation (else: this process's memory)
        self.waiting: dict[str, Call] = {}  # the conversation's calls waiting for results, as the store had them
        self.digests: list[int] | None = None  # this request's messages
        self.expected: dict[str, Call] = {}  # calls it made
        self.taken: list[str] = []  # calls whose results it brought
        self._kept = False

    def _recall(self) -> Recalled:
        if self._recalled is None:
            self._recalled = self.owner._recall(self) if self.conversation else Recalled(None, {})
        return self._recalled

    def new_messages_from(self, messages: list[str]) -> tuple[int, str | None]:
        """Where this request's messages (as JSON) stop repeating the last request's, and the trace
        of that last request."""
        if self._digested is not messages:  # asked again for the same messages: digested once
            self.digests = self.owner.digests(self.conversation, messages)
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

    def finish(self) -> None:
        """The answer is complete: kept now, before the client hears the end (its calls' results may
        come back in the next request, on any process)."""
        self.end()

    def end(self) -> None:
        """The request ended: what it leaves is kept, once."""
        if not self._kept:
            self._kept = True
            if self.digests is not None or self.expected or self.taken:
                self.owner._keep(self)


class StoredConversations(Conversations):
    """In the trace store, shared by every process serving it; this process's memory as a fallback."""

    def __init__(self, state: StateStore) -> None:
        super().__init__()
        self.state = state
        self._store = StateCalls(state.where, "conversation state")

    def begin(self, conversation: str | None) -> Turn:
        return Turn(self, conversation, self._store.submit(self.state.load, conversation) if conversation else None)

    @staticmethod
    def digest(message: str) -> int:
        return digest(message)  # the same in every process (str's hash is not)

    def _recall(self, turn: Turn) -> Recalled:
        if turn._ahead is not None:
            found = self._store.answer(turn._ahead)
            if found is not UNANSWERED:
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
        else:
            found = self._store.answer(self._store.submit(self.state.calls, call_ids))
            if found is not UNANSWERED:
                stored = {call_id: (_context(trace_id, span_id), name)
                          for call_id, (trace_id, span_id, name) in found.items()}
        if stored is None:  # the store did not answer: what this process knows
            return local
        return {c: stored[c] for c in call_ids if c in stored}

    def _keep(self, turn: Turn) -> None:
        super()._keep(turn)
        expected = {call_id: (format(span.trace_id, "032x"), format(span.span_id, "016x"), name)
                    for call_id, (span, name) in turn.expected.items()}
        self._store.answer(self._store.submit(self.state.save, turn.conversation, digests=turn.digests,
                                              expected=expected, taken=turn.taken, trace_id=turn.trace_id))

    def close(self) -> None:
        self._store.close()
        self.state.close()


def _context(trace_id: str, span_id: str) -> SpanContext:
    return SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
