"""What observation remembers between the requests of a conversation, in bounded memory.

- what each conversation's model has seen (prompt and output ids), to find what a new request adds;
- the messages of each conversation's last request (a digest each), to find which messages are new;
- tool calls waiting for their result to come back in a later request, to link the two.

Used from the rendering threads and the event loop alike, hence the lock.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from opentelemetry.trace import SpanContext

from looptrace.common.sequences import common_prefix


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
    def __init__(self, conversations: int = 1024, calls: int = 8192) -> None:
        self._seen: Bounded = Bounded(conversations)
        self._messages: Bounded = Bounded(conversations)
        self._calls: Bounded = Bounded(calls)
        self._lock = threading.Lock()

    def seen(self, conversation: str) -> list[int] | None:
        """The ids the conversation's model saw last (its prompt, then its output)."""
        with self._lock:
            return self._seen.get(conversation)

    def saw(self, conversation: str, ids: list[int]) -> None:
        with self._lock:
            self._seen.remember(conversation, ids)

    def new_messages_from(self, conversation: str, digests: list[int]) -> int:
        """Where this request's messages stop repeating the last request's; remembers these instead."""
        with self._lock:
            previous = self._messages.get(conversation) or []
            self._messages.remember(conversation, digests)
        return common_prefix(previous, digests)

    def expect_result(self, call_id: str, span: SpanContext, name: str) -> None:
        """A tool call was made; its result will come back in a later request."""
        with self._lock:
            self._calls.remember(call_id, (span, name))

    def take_result(self, call_id: str | None) -> tuple[SpanContext, str] | None:
        """The call a tool result answers (its span and tool name), once."""
        with self._lock:
            return self._calls.pop(call_id, None)
