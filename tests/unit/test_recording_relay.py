"""The relay the real-vLLM tests read vLLM's own answers from (tests/support/recording_relay.py).

test_real_vllm.py::test_verifiers_reads_looptrace_as_it_reads_vllm read the relay's exchanges as soon as
looptrace had answered its client, and sometimes found one fewer than the turns ("zip() argument 2 is
shorter than argument 1"): the relay kept an exchange only once it had relayed it to the end, and its
client (looptrace) has what it needs at `[DONE]`, before the relay's own side of the stream is closed.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import threading

from aiohttp import web

from recording_relay import RecordingRelay

LINGER = 1.0  # how long the upstream holds its stream open after [DONE]: the window a reader fell into


class Upstream:
    """A server whose /v1/completions streams one chunk and [DONE], then keeps the stream open a while."""

    def __enter__(self) -> Upstream:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)
        return self

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", self._stream)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices": [{"token_ids": [7], "prompt_token_ids": [1, 2]}]}\n\n')
        await response.write(b"data: [DONE]\n\n")
        await asyncio.sleep(LINGER)
        await response.write_eof()
        return response

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def read_until_done(url: str) -> None:
    """What looptrace's vLLM client does: it has the answer at [DONE], and goes on without the rest."""
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.request("POST", "/v1/completions", json.dumps({"prompt": [1, 2]}), {"Content-Type": "application/json"})
    response = connection.getresponse()
    seen = b""
    while b"[DONE]" not in seen:
        seen += response.read1(65536)
    connection.close()


def test_an_exchange_is_there_once_its_client_has_the_answer():
    with Upstream() as upstream, RecordingRelay(upstream.url) as relay:
        read_until_done(relay.url)
        (exchange,) = relay.generations()  # before the upstream has closed its stream
        assert exchange.request == b'{"prompt": [1, 2]}'
        assert exchange.events() == [{"choices": [{"token_ids": [7], "prompt_token_ids": [1, 2]}]}]  # whole
