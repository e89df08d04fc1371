"""An HTTP relay in front of a server (a real vLLM) that keeps every exchange: what a test asks the
server itself, not looptrace's record of it. Requests and answers pass through unchanged, streamed
answers chunk by chunk; each exchange is kept as (method, path, request body, answer body).

Used to read vLLM's own echo of the prompt it read (`prompt_token_ids`, asked for with
`return_token_ids`, which looptrace's vLLM backend sends on /v1/completions).

An exchange is kept as its request arrives, so that none is missing when looptrace has already answered
its client (the relay still finishing its side of the stream), and `generations()` waits until each
is whole: kept only once relayed, the last turn's exchange was sometimes not there yet when a test read.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "content-encoding"}


@dataclass
class Exchange:
    method: str
    path: str
    request: bytes
    answer: bytes = b""
    whole: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)

    def events(self) -> list[dict]:
        """A streamed answer's `data:` payloads (JSON), `[DONE]` left out."""
        return [json.loads(line[len("data: "):]) for line in self.answer.decode().splitlines()
                if line.startswith("data: {")]


class RecordingRelay:
    """`with RecordingRelay(url) as relay:` relay.url serves what `url` serves; relay.exchanges grows."""

    def __init__(self, target: str) -> None:
        self.target = target.rstrip("/")
        self.exchanges: list[Exchange] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> RecordingRelay:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)
        return self

    async def _start(self) -> None:
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._relay)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    def __exit__(self, *exc) -> None:
        async def stop() -> None:
            await self.runner.cleanup()
            await self.session.close()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    async def _relay(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        exchange = Exchange(request.method, request.path, body)
        self.exchanges.append(exchange)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        answer = bytearray()
        try:
            async with self.session.request(request.method, self.target + request.path_qs, data=body or None,
                                            headers=headers) as upstream:
                response = web.StreamResponse(status=upstream.status, headers={
                    k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP})
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    answer += chunk
                    await response.write(chunk)
                await response.write_eof()
            return response
        finally:  # whole, or as far as it went (a client that went away, an upstream that failed)
            exchange.answer = bytes(answer)
            exchange.whole.set()

    def generations(self, timeout: float = 30) -> list[Exchange]:
        """The exchanges that generated: POSTs to /v1/completions or /inference/v1/generate, in order,
        each once its answer is whole."""
        found = [e for e in list(self.exchanges)
                 if e.method == "POST" and e.path in ("/v1/completions", "/inference/v1/generate")]
        for exchange in found:
            assert exchange.whole.wait(timeout), f"an exchange on {exchange.path} still streaming after {timeout} s"
        return found
