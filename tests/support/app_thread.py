"""The real application in this process, its event loop on a thread of its own (the `replay_app`
fixture in conftest.py serves the tiny Qwen3.5 with it): tests set the recorded output they need,
and can wrap the backend to make it slow or fail, which a subprocess could not.
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request

from opentelemetry.sdk.trace import SpanProcessor

from looptrace.backends.base import BackendError
from looptrace.backends.recorded import ReplayBackend
from looptrace.proxy.api.app import create_app
from looptrace.proxy.api.keys import RUNTIME, TELEMETRY
from looptrace.proxy.settings import Settings


class AppThread:
    """The real application on 127.0.0.1, its event loop in a thread of this process."""

    def __init__(self, settings: Settings, send_buffer: int | None = None, access_log=None) -> None:
        """`send_buffer`: SO_SNDBUF for the connections it accepts, fixed (else the kernel's, which grows
        to megabytes on loopback): how much a client that stops reading leaves in the server's socket.
        `access_log`: a logger aiohttp writes a line to for every request answered (its status too)."""
        self.settings = settings
        self.send_buffer = send_buffer
        self.access_log = access_log
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None
        self.spans_open = OpenSpans()

    def start(self) -> "AppThread":
        self._thread.start()
        if not self._ready.wait(300):
            raise TimeoutError("the application did not start")
        if self.error:
            raise self.error
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._main())

    async def _main(self) -> None:
        from aiohttp import web

        try:
            self.app = create_app(self.settings)
            self.app[TELEMETRY].provider.add_span_processor(self.spans_open)  # after the store's: sees an end last
            runner = web.AppRunner(self.app, handler_cancellation=True, access_log=self.access_log)
            await runner.setup()
            if self.send_buffer is None:
                site = web.TCPSite(runner, "127.0.0.1", 0)
            else:
                import socket

                listener = socket.socket()
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.send_buffer)  # accepted sockets inherit it
                listener.bind(("127.0.0.1", 0))
                site = web.SockSite(runner, listener)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]
            await self.app[RUNTIME].ready()
        except BaseException as exc:  # noqa: BLE001 - reported to the test thread
            self.error = exc
            self._ready.set()
            return
        self._stop = asyncio.Event()
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    def stop(self) -> None:
        if hasattr(self, "_stop"):
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    @property
    def runtime(self):
        return self.app[RUNTIME]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def replay(self, *texts: str) -> ReplayBackend:
        """The next requests get these recorded outputs, one per request."""
        backend = ReplayBackend([{"text": t} for t in texts], self.runtime.vocab)
        self.runtime.backend = backend
        return backend

    def call(self, method: str, path: str, body: object = None, headers: dict | None = None) -> tuple[int, object]:
        """(status, the JSON answer) of one request."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=120) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"null")

    def settled(self, timeout: float = 30.0) -> None:
        """Every span begun so far has ended and is in the store, and every rollout noted: a request's
        server span ends when its handler returns, which for a stream can be after the client has read
        the last frame, and the store writes spans a moment later, in batches."""
        assert self.spans_open.none(timeout), f"spans still open after {timeout:g} s: {self.spans_open.names()}"
        telemetry = self.app[TELEMETRY]
        assert telemetry.flush(timeout), f"the store did not take every span within {timeout:g} s"
        telemetry._noting.submit(lambda: None).result(timeout)  # one worker: the rollouts noted before it are written

    def stored(self, path: str, timeout: float = 30.0, steps: int = 0) -> object:
        """GET `path` once the store holds what was asked so far (settled): a trace whole (`complete`),
        a session with at least `steps` steps."""
        self.settled(timeout)
        status, body = self.call("GET", path)
        whole = status == 200 and (not isinstance(body, dict) or body.get("complete", True))
        assert whole and (not steps or len(body.get("steps") or ()) >= steps), (status, body)
        return body

    def metric(self, name: str, **labels: str) -> float:
        """One series of /metrics, summed over the labels not given (0 when absent)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as response:
            text = response.read().decode()
        total = 0.0
        for line in text.splitlines():
            series, _, value = line.rpartition(" ")
            if series.split("{")[0] == name and all(f'{k}="{v}"' in series for k, v in labels.items()):
                total += float(value)
        return total

    def post(self, body: dict, path: str = "/v1/responses", headers: dict | None = None) -> tuple[int, str, bytes]:
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=60) as response:
                return response.status, response.headers["Content-Type"], response.read()
        except urllib.error.HTTPError as err:
            return err.code, err.headers["Content-Type"], err.read()


class OpenSpans(SpanProcessor):
    """The spans begun and not yet ended, and a wait on their ending (an event, not a poll)."""

    def __init__(self) -> None:
        self._open: dict[int, str] = {}
        self._changed = threading.Condition()

    def on_start(self, span, parent_context=None) -> None:
        with self._changed:
            self._open[span.context.span_id] = span.name

    def on_end(self, span) -> None:
        with self._changed:
            self._open.pop(span.context.span_id, None)
            self._changed.notify_all()

    def none(self, timeout: float) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: not self._open, timeout)

    def names(self) -> list[str]:
        with self._changed:
            return sorted(self._open.values())


class Wrapped:
    """The replay backend made slow before its first token, or failing after some tokens."""

    def __init__(self, inner: ReplayBackend, *, delay: float = 0.0, fail_after: int | None = None) -> None:
        self.inner, self.delay, self.fail_after = inner, delay, fail_after
        self.name, self.route, self.running, self.waiting = "replay", None, 0, 0
        self.serving, self.upstreams, self.expands_media, self.media_refusal = True, (), False, ""

    def health_details(self) -> dict:
        return {}

    async def generate(self, request):
        tokens = 0
        async for event in self.inner.generate(request):
            if event["type"] == "token":
                if tokens == 0:
                    await asyncio.sleep(self.delay)
                if tokens == self.fail_after:
                    raise BackendError("the upstream server went away", status=502, code="upstream_error")
                tokens += 1
            yield event

    async def close(self) -> None:
        return None


class Reading:
    """A backend that keeps the prompt ids of every request it is handed and the ids it wrote for it:
    what the engine read and sampled, not looptrace's record of either."""

    def __init__(self, inner) -> None:
        self.inner, self.read, self.wrote = inner, [], []
        self.name, self.route, self.running, self.waiting = "replay", None, 0, 0
        self.serving, self.upstreams, self.expands_media, self.media_refusal = True, (), False, ""

    def health_details(self) -> dict:
        return {}

    async def generate(self, request):
        self.read.append(list(request.prompt_ids))
        wrote: list[int] = []
        self.wrote.append(wrote)
        async for event in self.inner.generate(request):
            if event["type"] == "token":
                wrote.append(event["id"])
            yield event

    async def close(self) -> None:
        return None
