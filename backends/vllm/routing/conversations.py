"""Where each conversation's requests go: the server of its last request (the pool says from it when a conversation
moved), and how many conversations each server keeps lately (those whose last request this process sent there
within RECENT_SECONDS). cache-aware routing asks for those counts before it moves a conversation that holds no cache
of its own anywhere yet (policies.py): such a move loses nothing now, but takes the conversation's later turns along,
and only where the servers keep unevenly many conversations is that a reason for it.

Work per request is constant: both tables are kept least recent first, and what leaves the window leaves from the
front."""

from __future__ import annotations

import time
from collections import Counter, OrderedDict

REMEMBERED = 65536  # conversations whose last server is remembered, to count the ones that move
RECENT_SECONDS = 300.0  # a conversation is kept by the server of its last request for this long after it


class Conversations:
    def __init__(self) -> None:
        self._last: OrderedDict[str, str] = OrderedDict()  # conversation → the server of its last request
        self._recent: OrderedDict[str, tuple[str, float]] = OrderedDict()  # of those, the recent ones, and when
        self._kept: Counter[str] = Counter()  # server → its recent conversations

    def last(self, conversation: str) -> str | None:
        """The server of the conversation's last request, if remembered."""
        return self._last.get(conversation)

    def kept(self) -> Counter[str]:
        """Each server's count of conversations whose last request went there within RECENT_SECONDS."""
        horizon = time.monotonic() - RECENT_SECONDS
        while self._recent:
            conversation, (server, at) = next(iter(self._recent.items()))
            if at >= horizon:
                break
            del self._recent[conversation]
            self._kept[server] -= 1
        return self._kept

    def sent(self, conversation: str, server: str) -> str | None:
        """A request of the conversation went to `server`: the server it moved from, if another."""
        before = self._last.get(conversation)
        self._last[conversation] = server
        self._last.move_to_end(conversation)
        if len(self._last) > REMEMBERED:
            self._last.popitem(last=False)
        counted = self._recent.pop(conversation, None)
        if counted is not None:
            self._kept[counted[0]] -= 1
        self._recent[conversation] = (server, time.monotonic())
        self._kept[server] += 1
        return before if before is not None and before != server else None
