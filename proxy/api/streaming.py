"""One stream relay for every API: SSE headers, a generation's first step awaited in a task of its own,
a writer that sends a burst of frames in one write, keep-alives in silence, and the ladder of what
ends a stream (its finish, a backend's refusal after the headers, a bug) in the API's own shape.
Each API only says what its events are (a StreamFormat: each a name and the JSON of one object); the
transport frames them (a Framing): SSE adds `event:`/`data:` lines here, a WebSocket sends each JSON as
a message (openai/responses/websocket.py). A fourth API is its format and its route.

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
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import aclosing, asynccontextmanager, suppress
from typing import NamedTuple, Protocol, TypeAlias

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

# One event of a stream: its name (None for an API that names none: Chat Completions) and the JSON of
# one object, as bytes. A format makes events; only the transport (a Framing) makes frames of them.
Event: TypeAlias = tuple[str | None, bytes]


class FrameWriter:
    """Writes a stream's frames, those made in one run of the handler together.

    Tokens come in bursts (several in one read of a vLLM stream, a run of verified drafts), and a
    socket write per token was a fifth of the relay's CPU. `write` only queues; the queue goes out in
    one write when the handler next waits, in the same turn of the event loop, so no frame is late.
    A failed write (the client left) is raised by the next `write` or by `flush`.

    `response` is anything with `async write(burst)`: an SSE response, handed each burst as one bytes,
    or with `messages` a WebSocket's sink (Framing), handed the burst's frames as a list, one message each.
    """

    def __init__(self, response, write_timeout: float | None = None,
                 transport: asyncio.Transport | None = None, *, messages: bool = False) -> None:
        self._response = response
        self._messages = messages
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

    def _burst(self) -> bytes | list[bytes]:
        frames, self._frames = self._frames, []
        self._held = 0
        return frames if self._messages else b"".join(frames)

    async def write(self, *frames: bytes) -> None:
        sending = self._sending
        if sending is not None:
            if sending.done():
                sending.result()  # a write failed: the client is gone
            elif self._stalled():
                raise self._dropped(sending)
        self.last = time.monotonic()
        if not frames:
            return  # nothing to send (a keepalive a transport has none of): the silence is still broken
        for frame in frames:
            self._frames.append(frame)
            self._held += len(frame)
        if sending is None:
            self._since = time.monotonic()
            self._sending = asyncio.get_running_loop().create_task(self._send())
        elif self._held > HELD_BYTES:
            await self._taken(sending)  # the client reads slower than tokens come: wait for it

    async def opening(self, frame: bytes, first: asyncio.Future) -> None:
        """A frame of the stream's opening: with the first token when that is here already (one write),
        else at once, so the client sees the stream start while the model is still reading the prompt."""
        if first.done():
            self._frames.append(frame)
            self._held += len(frame)
        else:
            await self.write(frame)

    async def write_now(self, *frames: bytes) -> None:
        """Queued frames and these, written before returning: for the stream's opening (its first
        token), which would otherwise wait a turn of the loop, behind every other stream's tokens."""
        if self._sending is not None:
            await self.write(*frames)
            return
        self._frames += frames
        self.last = time.monotonic()
        burst = self._burst()
        if not burst and self._messages:
            return
        # An SSE response's headers may wait for its first frame (FirstFrameResponse): with no frame yet, they go alone.
        try:
            async with asyncio.timeout(self._write_timeout):  # in place: a task would wait a turn
                await self._response.write(burst)
        except TimeoutError:
            raise self._dropped(None) from None

    async def _send(self) -> None:
        while self._frames:
            burst = self._burst()
            self._since = time.monotonic()
            await self._response.write(burst)
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


class Framing(Protocol):
    """How a transport frames a stream format's events: SSE (below), or a WebSocket's messages
    (openai/responses/websocket.py), which is also the sink its frames are written to."""

    messages: bool  # each frame a message of its own: the FrameWriter hands the sink a burst as a list

    def frames(self, events: list[Event]) -> Sequence[bytes]:
        """The frames of some events, in order; none for none."""

    def end(self, events: list[Event], done: bool) -> Sequence[bytes]:
        """The frames of a stream's last events; `done`: its format's SSE stream ends with `data: [DONE]`."""

    def keepalive(self, events: list[Event]) -> Sequence[bytes]:
        """The frames of a silence: the format's keepalive events, or with none the transport's own."""


_HEADS: dict[str | None, bytes] = {None: b"data: "}  # each event name's `event:` line, made once


def _sse_head(name: str) -> bytes:
    head = _HEADS[name] = f"event: {name}\ndata: ".encode()
    return head


class SSE:
    """Server-Sent Events: an event is `event: NAME` (where the API names its events) and `data: JSON`,
    then a blank line. OpenAI's APIs end a stream with `data: [DONE]` (SSE's alone: their SDKs stop on
    it); a silence with no keepalive event of the API's own (Chat Completions) is filled by a comment."""

    messages = False

    def frames(self, events: list[Event]) -> tuple[bytes, ...]:
        if len(events) == 1:  # the per-token path: one text delta
            name, data = events[0]
            return ((_HEADS.get(name) or _sse_head(name)) + data + b"\n\n",)
        if not events:
            return ()
        return (b"".join([(_HEADS.get(name) or _sse_head(name)) + data + b"\n\n" for name, data in events]),)

    def end(self, events: list[Event], done: bool) -> tuple[bytes, ...]:
        frames = self.frames(events)
        return (b"".join(frames) + SSE_DONE,) if done else frames

    def keepalive(self, events: list[Event]) -> tuple[bytes, ...]:
        return self.frames(events) if events else (SSE_KEEPALIVE,)


SSE_DONE = b"data: [DONE]\n\n"
SSE_KEEPALIVE = b": keepalive\n\n"  # an SSE comment: every client's parser skips it


class FirstFrameResponse(web.StreamResponse):
    """A stream response whose headers wait for its first write and go out with it, as aiohttp's own
    Response sends them: a write and a wake of the client fewer before the first token. (An aiohttp
    that predates the switch sends them at once, as StreamResponse does.)"""

    _send_headers_immediately = False


class Opened(NamedTuple):
    """A stream whose headers went out: the generation's steps after the first, the first as a
    task, the writer for the response's frames, and how its transport frames events."""

    response: web.StreamResponse
    steps: AsyncIterator
    first: asyncio.Future
    out: FrameWriter
    framing: Framing


@asynccontextmanager
async def opened_stream(request: web.Request, steps: AsyncIterator,
                        write_timeout: float | None, sink: Framing | None = None) -> AsyncIterator[Opened]:
    """What every streaming adapter does before its first frame: wait up to one keepalive interval for
    the first step (a refusal by then still gets its status code), then send the SSE headers. On the
    way out the steps are closed (which stops the generation) and nothing more is written.
    `write_timeout`: --stream-write-timeout, past which a client that reads nothing is dropped.
    `sink`: where the events go instead of an SSE response: a Framing with `async write(burst)` (a
    WebSocket's, which sends each event as a message)."""
    async with aclosing(steps), first_step(steps) as first:
        await wait_before_opening(first)
        response, framing = sink, sink
        if sink is None:
            # The first step here already (nearly always): the headers go out with its frames, in one write.
            opening = FirstFrameResponse if first.done() else web.StreamResponse
            response, framing = opening(headers=SSE_HEADERS), SSE()
            await response.prepare(request)
        out = FrameWriter(response, write_timeout, request.transport, messages=framing.messages)
        try:
            yield Opened(response, steps, first, out, framing)
        finally:
            out.close()


class StreamFormat(Protocol):
    """What one API says on a stream (chat completion chunks, Responses events, Anthropic's message
    events), as events: relay() calls these in order, and the transport frames what they return."""

    name: str  # the API, as the log names a stream that failed
    ends_with_done: bool  # its SSE stream ends with `data: [DONE]` (OpenAI's APIs); no other transport says it

    def start(self, generation: Generation) -> list[Event]:
        """The stream's opening, sent before the first token (while the prompt is read)."""

    def frames(self, step: Step) -> list[Event]:
        """The events a step of the generation (a token's deltas) becomes; [] for none."""

    def finish(self, generation: Generation) -> list[Event]:
        """The end of an answer that ended as answers do (stop, length, a tool call)."""

    def failed(self, error: APIError, generation: Generation) -> list[Event]:
        """The end of a stream whose generation failed after its headers went out: too late for a
        status code, the error goes in the stream, in the API's shape, where its SDK raises it."""

    def keepalive(self) -> list[Event]:
        """What to send after KEEPALIVE_SECONDS of silence, so that clients and proxies keep waiting;
        [] for the transport's own (an SSE comment)."""


def each(parts: list[list[Event]]) -> list[Event]:
    """The events of a step's deltas (dispatch()'s lists, one per delta), in order: most steps have one."""
    return parts[0] if len(parts) == 1 else [event for part in parts for event in part]


async def relay(request: web.Request, generation: Generation, fmt: StreamFormat, trace: RequestTelemetry,
                before_end: Callable[[], Awaitable[None]] | None = None,
                sink: Framing | None = None) -> web.StreamResponse:
    """The generation streamed as `fmt`'s events. `before_end`: awaited before the last frame goes out
    (a Responses answer is stored then, so that the client's next turn can name it at once). `sink`:
    see opened_stream."""
    bound = generation.runtime.settings.stream_write_timeout  # for a client that stops reading
    async with opened_stream(request, generation.run(), bound, sink) as (response, steps, first, out, framing):
        for frame in framing.frames(fmt.start(generation)):
            await out.opening(frame, first)
        pacer = asyncio.create_task(_keep_alive(out, fmt, framing))
        try:
            step = await first
            if step is not END:
                await out.write_now(*framing.frames(fmt.frames(step)))
                async for step in steps:
                    events = fmt.frames(step)
                    if events:
                        await out.write(*framing.frames(events))
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
        await out.write(*framing.end(end, fmt.ends_with_done))
        await out.flush()
        return response


async def _keep_alive(out: FrameWriter, fmt: StreamFormat, framing: Framing) -> None:
    """`fmt`'s keep-alive after every KEEPALIVE_SECONDS without a frame, for the whole stream."""
    while True:
        wait = out.last + KEEPALIVE_SECONDS - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
            continue
        try:
            await out.write(*framing.keepalive(fmt.keepalive()))
        except ConnectionError:
            return  # the client left; the handler is being cancelled too
