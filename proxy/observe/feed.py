"""Stored requests as they land, for pages that watch a running agent (the trace viewer's live view).

The store's writing thread publishes each committed batch; every subscriber gets it on the event
loop through a bounded queue of its own. A subscriber too slow to keep up loses batches, never
slows the store: it is told so (a `None` in its queue) and can reload what it shows.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

QUEUE = 256  # batches a subscriber may fall behind


class LiveFeed:
    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._subscribers: set[asyncio.Queue] = set()

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """The event loop subscribers live on (known once the server runs)."""
        self._loop = loop

    def publish(self, steps: list[dict]) -> None:
        """From any thread: a batch of stored steps."""
        loop = self._loop
        if loop is None or not self._subscribers:
            return
        try:
            loop.call_soon_threadsafe(self._deliver, steps)
        except RuntimeError:  # the loop has closed: nobody is watching any more
            pass

    def _deliver(self, steps: list[dict]) -> None:
        for queue in list(self._subscribers):
            try:
                queue.put_nowait(steps)
            except asyncio.QueueFull:
                queue.get_nowait()  # the oldest goes; the gap is marked
                queue.put_nowait(None)

    @asynccontextmanager
    async def subscribe(self) -> AsyncIterator[asyncio.Queue]:
        queue: asyncio.Queue = asyncio.Queue(QUEUE)
        self._subscribers.add(queue)
        try:
            yield queue
        finally:
            self._subscribers.discard(queue)
