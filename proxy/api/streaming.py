"""One stream relay for every API: SSE headers, a generation's first step awaited in a task of its own,
a writer that sends a burst of frames in one write, keep-alives in silence, and the ladder of what
ends a stream (its finish, a backend's refusal after the headers, a bug) in the API's own shape.
Each API only says what its frames are (a StreamFormat): a fourth API is its format and its route.

A stream's headers wait for the first step, so a refusal that comes quickly (a full queue, a prompt
the upstream refuses) keeps its HTTP status. A long wait (a queue, a long prompt's prefill on a CPU)
opens the stream instead, and the adapter sends keepalives while it lasts, so that clients and
proxies with idle timeouts keep waiting.

A client that stops reading is waited for at most --stream-write-timeout seconds (settings.py), then
treated as gone: its connection is closed and its generation stopped, so that it cannot hold the
model (the local and llama.cpp backends decode one request at a time) by never reading.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing, asynccontextmanager, suppress
from typing import NamedTuple, Protocol

from aiohttp import web

from looptrace.backends.base import BackendError

from ..engine.generation import Generation
from ..engine.request import Step
from ..observe.telemetry import RequestTelemetry
from .errors import APIError, ClientStoppedReading, answered, internal_error

log = logging.getLogger("looptrace")

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
KEEPALIVE_SECONDS = 15.0  # the longest a stream waits silent: for its headers, then between keepalives
END = object()  # what the first step is when the generation yielded nothing
HELD_BYTES = 256 * 1024  # frames a writer holds before the adapter waits for the client to read


class FrameWriter:
    """Writes SSE frames, those made in one run of the handler together.

    Tokens come in bursts (several in one read of a vLLM stream, a run of verified drafts), and a
    socket write per token was a fifth of the relay's CPU. `write` only queues; the queue goes out in
    one write when the handler next waits, in the same turn of the event loop, so no frame is late.
    A failed write (the client left) is raised by the next `write` or by `flush`.
    """

    def __init__(self, response, write_timeout: float | None = None,
                 transport: asyncio.Transport | None = None) -> None:
        self._response = response
        self._frames: list[bytes] = []
        self._held = 0
        self._sending: asyncio.Task | None = None
        # A client that takes nothing of a write for `write_timeout` seconds (None: no bound) is gone.
        # A write blocks only once the socket's and the transport's buffers are full; when it began is
        # kept, and looked at as the handler writes the next frames (a clock read: no timer per token).
        self._write_timeout = write_timeout
        self._transport = transport
        self._since = 0.0  # when the write under way began
        self.last = time.monotonic()  # when a frame was last handed in: silence is measured from here

    def _stalled(self) -> bool:
        return self._write_timeout is not None and time.monotonic() - self._since > self._write_timeout

    async def _taken(self, sending: asyncio.Future) -> None:
        """Until the client has taken `sending`, or has taken nothing of it for the write timeout."""
        left = None if self._write_timeout is None else self._write_timeout - (time.monotonic() - self._since)
        try:
            await asyncio.wait_for(asyncio.shield(sending), left if left is None or left > 0 else 0)
        except TimeoutError:
            raise self._dropped(sending) from None

    def _dropped(self, sending: asyncio.Future | None) -> ClientStoppedReading:
        if self._transport is not None:
            self._transport.abort()  # what is queued for it is dropped; the pending write fails
        if sending is not None:
            sending.add_done_callback(_seen)
        return ClientStoppedReading(f"the client read nothing for {self._write_timeout:g} s")

    async def write(self, frame: bytes) -> None:
        sending = self._sending
        if sending is not None:
            if sending.done():
                sending.result()  # a write failed: the client is gone
            elif self._stalled():
                raise self._dropped(sending)
        self._frames.append(frame)
        self._held += len(frame)
        self.last = time.monotonic()
        if sending is None:
            self._since = time.monotonic()
            self._sending = asyncio.get_running_loop().create_task(self._send())
        elif self._held > HELD_BYTES:
            await self._taken(sending)  # the client reads slower than tokens come: wait for it

    async def opening(self, frame: bytes, first: asyncio.Future) -> None:
        """The stream's first frame: with the first token when that is here already (one write), else
        at once, so the client sees the stream start while the model is still reading the prompt."""
        if first.done():
            self._frames.append(frame)
            self._held += len(frame)
        else:
            await self.write(frame)

    async def write_now(self, frame: bytes) -> None:
        """Queued frames and this one, written before returning: for the stream's opening (its first
        token), which would otherwise wait a turn of the loop, behind every other stream's tokens."""
        if self._sending is not None:
            await self.write(frame)
            return
        self._frames.append(frame)
        self.last = time.monotonic()
        data = b"".join(self._frames)
        self._frames.clear()
        self._held = 0
        try:
            async with asyncio.timeout(self._write_timeout):  # in place: a task would wait a turn
                await self._response.write(data)
        except TimeoutError:
            raise self._dropped(None) from None

    async def _send(self) -> None:
        while self._frames:
            data = b"".join(self._frames)
            self._frames.clear()
            self._held = 0
            self._since = time.monotonic()
            await self._response.write(data)
        self._sending = None

    async def flush(self) -> None:
        """Until everything queued is written."""
        if self._sending is not None:
            await self._taken(self._sending)

    def close(self) -> None:
        """The handler is done (or cancelled): nothing more goes out."""
        sending = self._sending
        if sending is not None:
            if sending.done():
                if not sending.cancelled():
                    sending.exception()  # seen: the handler has its own error to report
            else:
                sending.cancel()


def _seen(write: asyncio.Future) -> None:
    if not write.cancelled():
        write.exception()  # the write failed as the connection closed: nothing to report


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


class Opened(NamedTuple):
    """A stream whose headers went out: the generation's steps after the first, the first as a
    task, and the writer for the response's frames."""

    response: web.StreamResponse
    steps: AsyncIterator
    first: asyncio.Future
    out: FrameWriter


@asynccontextmanager
async def opened_stream(request: web.Request, steps: AsyncIterator,
                        write_timeout: float | None, sink=None) -> AsyncIterator[Opened]:
    """What every streaming adapter does before its first frame: wait up to one keepalive interval for
    the first step (a refusal by then still gets its status code), then send the SSE headers. On the
    way out the steps are closed (which stops the generation) and nothing more is written.
    `write_timeout`: --stream-write-timeout, past which a client that reads nothing is dropped.
    `sink`: where the frames go instead of an SSE response (anything with `async write(bytes)`: a
    WebSocket's, which sends each event as a message)."""
    async with aclosing(steps), first_step(steps) as first:
        await wait_before_opening(first)
        response = sink
        if response is None:
            response = web.StreamResponse(headers=SSE_HEADERS)
            await response.prepare(request)
        out = FrameWriter(response, write_timeout, request.transport)
        try:
            yield Opened(response, steps, first, out)
        finally:
            out.close()


class StreamFormat(Protocol):
    """What one API writes on a stream (chat completion chunks, Responses events, Anthropic's message
    events): relay() calls these in order, and writes what they return."""

    name: str  # the API, as the log names a stream that failed

    def start(self, generation: Generation) -> bytes:
        """The stream's opening, sent before the first token (while the prompt is read)."""

    def frames(self, step: Step) -> bytes:
        """What a step of the generation (a token's deltas) becomes; b"" for nothing."""

    def finish(self, generation: Generation) -> bytes:
        """The end of an answer that ended as answers do (stop, length, a tool call)."""

    def failed(self, error: APIError, generation: Generation) -> bytes:
        """The end of a stream whose generation failed after its headers went out: too late for a
        status code, the error goes in the stream, in the API's shape, where its SDK raises it."""

    def keepalive(self) -> bytes:
        """What to send after KEEPALIVE_SECONDS of silence, so that clients and proxies keep waiting."""


async def relay(request: web.Request, generation: Generation, fmt: StreamFormat, trace: RequestTelemetry,
                before_end: Callable[[], Awaitable[None]] | None = None, sink=None) -> web.StreamResponse:
    """The generation streamed in `fmt`'s frames. `before_end`: awaited before the last frame goes out
    (a Responses answer is stored then, so that the client's next turn can name it at once). `sink`:
    see opened_stream."""
    bound = generation.runtime.settings.stream_write_timeout  # for a client that stops reading
    async with opened_stream(request, generation.run(), bound, sink) as (response, steps, first, out):
        await out.opening(fmt.start(generation), first)
        pacer = asyncio.create_task(_keep_alive(out, fmt))
        try:
            step = await first
            if step is not END:
                await out.write_now(fmt.frames(step))
                async for step in steps:
                    frames = fmt.frames(step)
                    if frames:
                        await out.write(frames)
            end = fmt.finish(generation)
        except BackendError as err:
            trace.stream_failed(err.code)
            end = fmt.failed(answered(request, err), generation)
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception:  # noqa: BLE001 - the stream is open: the error must end it in the API's shape
            trace.stream_failed("internal_error")
            end = fmt.failed(internal_error(f"{fmt.name} stream failed"), generation)
        finally:
            pacer.cancel()
        if before_end is not None:
            await before_end()
        await out.write(end)
        await out.flush()
        return response


async def _keep_alive(out: FrameWriter, fmt: StreamFormat) -> None:
    """`fmt`'s keep-alive after every KEEPALIVE_SECONDS without a frame, for the whole stream."""
    while True:
        wait = out.last + KEEPALIVE_SECONDS - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
            continue
        try:
            await out.write(fmt.keepalive())
        except ConnectionError:
            return  # the client left; the handler is being cancelled too
