"""What the engine remembers of each conversation: the ids its model read and sampled on the
conversation's last turn, and what that turn was asked and answered (turn_digests.py), from which token
continuity (continuity.py) builds or judges the next turn's prompt.

`Generation` writes it, once its answer is complete and before the client hears the end, so that the
conversation's next turn finds it whichever process that turn lands on; observers only read it
(`Generation.previous`: the part of a prompt new since the last turn, a prompt stored as what it adds
to the last one). A request works through a `Recall`: the last turn is read once, ahead (the API opens
it when the request names its conversation, so the read overlaps its preparation), and this turn is
written once.

`Memory` keeps it in this process's memory, bounded (`--trace-db off`). `StoredMemory` keeps it in the
trace store's state (trace_store/state.py, `state_turns`), so any process serving that store can take
any turn; while the store does not answer it serves from this process's memory (state_calls.py).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass

from looptrace.trace_store.state import MAX_CONVERSATIONS, StateStore

from . import turn_digests
from .state_calls import UNANSWERED, StateCalls
from .turn_digests import TurnDigests


@dataclass(frozen=True, slots=True)
class LastTurn:
    """A conversation's last turn, as its model read and wrote it. Never written once made."""

    ids: list[int]  # its prompt as the model read it (a forced opening included), then the ids it sampled
    prompt_length: int  # how many of `ids` are the prompt
    encoding: int = 0  # the prompt's encoding (families/incremental.py), 0: unknown
    label: str | None = None  # the request that left it, as the API names it (its trace id), if it does
    digests: TurnDigests | None = None  # what it was asked and answered; None: continuity was off for it

    @property
    def prompt(self) -> list[int]:
        return self.ids[:self.prompt_length]

    @property
    def sampled(self) -> list[int]:
        return self.ids[self.prompt_length:]


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


class Memory:
    """In this process's memory. Used from the rendering threads and the event loop alike, hence the lock."""

    def __init__(self, conversations: int = MAX_CONVERSATIONS) -> None:
        self._last: Bounded = Bounded(conversations)
        self._lock = threading.Lock()

    def recall(self, conversation: str, label: str | None = None) -> Recall:
        """A request's view of its conversation; `label`: what the turn it leaves is named by."""
        return Recall(self, conversation, label, None)

    def _read(self, conversation: str, ahead: Future | None) -> LastTurn | None:
        with self._lock:
            return self._last.get(conversation)

    def _write(self, conversation: str, turn: LastTurn) -> None:
        with self._lock:
            self._last.remember(conversation, turn)

    def close(self) -> None:
        pass


class Recall:
    """One request's view of its conversation's memory: the last turn, read once; this one, kept once."""

    __slots__ = ("memory", "conversation", "label", "_ahead", "_last", "_read", "_kept")

    def __init__(self, memory: Memory, conversation: str, label: str | None, ahead: Future | None) -> None:
        self.memory, self.conversation, self.label, self._ahead = memory, conversation, label, ahead
        self._last: LastTurn | None = None
        self._read = self._kept = False

    def last(self) -> LastTurn | None:
        """The conversation's last turn (None: none known), read once."""
        if not self._read:
            self._last, self._read = self.memory._read(self.conversation, self._ahead), True
        return self._last

    def keep(self, ids: list[int], prompt_length: int, encoding: int, digests: TurnDigests | None) -> None:
        """This turn, complete: kept once, before the client hears the end."""
        if not self._kept:
            self._kept = True
            self.memory._write(self.conversation, LastTurn(ids, prompt_length, encoding, self.label, digests))


class StoredMemory(Memory):
    """In the trace store, shared by every process serving it; this process's memory as a fallback."""

    def __init__(self, state: StateStore) -> None:
        super().__init__()
        self.state = state
        self._calls = StateCalls(state.where, "the conversations' last turns")

    def recall(self, conversation: str, label: str | None = None) -> Recall:
        return Recall(self, conversation, label, self._calls.submit(self.state.load_turn, conversation))

    def _read(self, conversation: str, ahead: Future | None) -> LastTurn | None:
        found = self._calls.answer(ahead)
        if found is UNANSWERED:
            return super()._read(conversation, ahead)
        if found is None:
            return None
        ids, prompt_length, encoding, label, digests = found
        return LastTurn(ids, prompt_length, encoding or 0, label, turn_digests.unpack(digests))

    def _write(self, conversation: str, turn: LastTurn) -> None:
        super()._write(conversation, turn)  # this process's copy, served while the store does not answer
        digests = turn_digests.pack(turn.digests) if turn.digests is not None else None
        self._calls.answer(self._calls.submit(self.state.save_turn, conversation, turn.ids, turn.prompt_length,
                                              turn.encoding, turn.label, digests))

    def close(self) -> None:
        self._calls.close()  # the store itself is the telemetry's, which closes it
