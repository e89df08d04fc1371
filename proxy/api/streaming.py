"""What both streaming adapters share: SSE headers, the keepalive interval, and a generation's first
step awaited in a task of its own.

A stream's headers wait for the first step, so a refusal that comes quickly (a full queue, a prompt
the upstream refuses) keeps its HTTP status. A long wait (a queue, a long prompt's prefill on a CPU)
opens the stream instead, and the adapter sends keepalives while it lasts, so that clients and
proxies with idle timeouts keep waiting.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
KEEPALIVE_SECONDS = 15.0  # the longest a stream waits silent: for its headers, then between keepalives
END = object()  # what the first step is when the generation yielded nothing


@asynccontextmanager
async def first_step(steps: AsyncIterator) -> AsyncIterator[asyncio.Future]:
    """The first step of `steps` as a task; on the way out, left idle, so that `aclosing` can close it."""
    first = asyncio.ensure_future(anext(steps, END))
    try:
        yield first
    finally:
        if not first.done():
            first.cancel()
            with suppress(BaseException):
                await first


async def wait_before_opening(first: asyncio.Future) -> None:
    """Up to one keepalive interval; a step that failed by then raises here, before any header is sent."""
    await asyncio.wait({first}, timeout=KEEPALIVE_SECONDS)
    if first.done():
        first.result()
