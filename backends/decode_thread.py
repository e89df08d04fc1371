"""One thread that runs every model call, requests first in first out, for a backend that decodes
in this process (local, llama.cpp).

The event loop never runs model code: a request goes to the thread through a queue, and its events
come back through the loop's call_soon_threadsafe. Past `max_queue` requests waiting, a new one is
refused with a 429. However the consumer leaves (a disconnect, a stop string, an error), the
request's `cancel` is set, and the decode function checks it before every token.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future

from .base import BackendError, Busy, DecodeRequest
from .events import Event, done_event

log = logging.getLogger("looptrace")

Emit = Callable[[object], None]
Decode = Callable[[DecodeRequest, Emit], None]  # emits prefill, tokens, done; raises to fail the request


class DecodeThread:
    def __init__(self, decode: Decode, *, max_queue: int, name: str) -> None:
        self.decode = decode
        self.name = name  # in the thread's name and in the error a failed request gets
        self.max_queue = max_queue
        self.running = 0
        self._jobs: queue.Queue = queue.Queue()
        self._worker = threading.Thread(target=self._work, name=f"looptrace-{name}", daemon=True)
        self._worker.start()

    @property
    def waiting(self) -> int:
        return self._jobs.qsize()

    def call(self, function: Callable[[], object]) -> object:
        """Runs `function` on the thread, after the requests already queued, and returns its result."""
        future: Future = Future()
        self._jobs.put((function, future))
        return future.result()

    async def run(self, function: Callable[[], object]) -> object:
        """`function` on the thread in its turn among the requests, under the same bound on waiting,
        awaited without holding a thread of the event loop's pool (a scoring request: scoring.py)."""
        if self.waiting >= self.max_queue and (self.running or self.waiting):
            raise Busy(f"{self.waiting} requests are already waiting for the model; try again later")
        future: Future = Future()
        self._jobs.put((function, future))
        return await asyncio.wrap_future(future)

    async def generate(self, request: DecodeRequest) -> AsyncIterator[Event]:
        # --max-queue 0: no waiting room, one request at a time. (The check and the put below run in
        # one turn of the event loop, so two requests cannot both find the model idle.)
        if self.waiting >= self.max_queue and (self.running or self.waiting):
            raise Busy(f"{self.waiting} requests are already waiting for the model; try again later")
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def emit(event: object) -> None:
            try:
                loop.call_soon_threadsafe(events.put_nowait, event)
            except RuntimeError:  # the loop is gone: nobody is listening any more
                request.cancel.set()

        self._jobs.put((request, emit))
        try:
            while True:
                event = await events.get()
                if isinstance(event, BaseException):
                    raise event
                yield event
                if event["type"] == "done":
                    return
        finally:
            request.cancel.set()

    def stop(self) -> None:
        """The thread ends once the requests queued before this have run."""
        self._jobs.put((None, None))

    async def close(self) -> bool:
        """stop(), and wait for the thread to end; False when it has not within 30 s."""
        self.stop()
        await asyncio.to_thread(self._worker.join, 30)
        return not self._worker.is_alive()

    def _work(self) -> None:
        while True:
            request, emit = self._jobs.get()
            if request is None:
                return
            if isinstance(emit, Future):  # a function to run here (see `call`)
                try:
                    emit.set_result(request())
                except BaseException as exc:  # noqa: BLE001 - handed to the caller, which re-raises it
                    emit.set_exception(exc)
                continue
            if request.cancel.is_set():  # the client left while it waited
                emit(done_event("cancelled", 0, 0.0, cached_tokens=0))
                continue
            # The request's last word (its `done`, or its failure) is held until the model is free, so a
            # client that sends its next request the moment an answer ends never finds it busy.
            last: list = []

            def emit_until_done(event: object, emit: Emit = emit, last: list = last) -> None:
                if isinstance(event, dict) and event.get("type") == "done":
                    last.append(event)
                else:
                    emit(event)

            self.running += 1
            try:
                self.decode(request, emit_until_done)
            except BackendError as exc:
                last[:] = [exc]
            except Exception:  # the client must hear why, and the thread must live on
                log.exception("%s decoding failed", self.name)
                last[:] = [BackendError(f"{self.name} decoding failed on this request; the server's log has why",
                                        status=500, code="decode_failed")]
            finally:
                self.running -= 1
            for event in last:
                emit(event)


class OnDecodeThread:
    """The Backend members of one that decodes in this process on a DecodeThread (`_thread`): it
    serves whenever it is loaded, forwards to no server, and queues its requests itself."""

    route = None
    expands_media = False
    serving = True
    upstreams: tuple = ()
    _thread: DecodeThread

    @property
    def running(self) -> int:
        return self._thread.running

    @property
    def waiting(self) -> int:
        return self._thread.waiting

    def generate(self, request: DecodeRequest) -> AsyncIterator[Event]:
        return self._thread.generate(request)
