"""What a real vLLM does that the double did not, handled where looptrace talks to it (backends/vllm/upstream.py,
vllm/stream.py); against the real server in tests/integration/test_real_vllm.py.

- vLLM's HTTP server closes a connection idle for 5 s; a request looptrace sends on a pooled connection
  as that happens was never read, and goes again on a new one (it was a 502 "Server disconnected").
- vLLM's engine refuses some requests after the 200, as an error frame with a 4xx code (a prompt past
  the context on the generate route): the client's error, in vLLM's words (it was a 502)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from looptrace.backends.base import BackendError
from looptrace.backends.vllm.stream import _upstream_error, read_chunk
from looptrace.backends.vllm.upstream import Upstream

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


class ClosingOnReuse:
    """An HTTP server that answers the first request on each connection and keeps it open, then closes it
    unanswered when another request arrives on it: a keep-alive running out just as a client reuses it."""

    def __init__(self) -> None:
        self.connections = 0
        self.closed_unanswered = 0

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc) -> None:
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        answered = False
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                if answered:
                    self.closed_unanswered += 1
                    return
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                writer.write(ANSWER)
                await writer.drain()
                answered = True
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def _posts(count: int) -> tuple[list[int], ClosingOnReuse]:
    server = ClosingOnReuse()
    async with server as url:
        up = Upstream(url)
        try:
            statuses = []
            for _ in range(count):
                response = await up.send("/v1/completions", b"{}", {"Content-Type": "application/json"},
                                         up.stream_timeout)
                statuses.append(response.status)
                await response.read()  # the connection goes back to the pool
                response.release()
        finally:
            await up.close()
    return statuses, server


def test_a_request_on_a_connection_the_server_closes_goes_again_on_a_new_one():
    statuses, server = asyncio.run(_posts(3))
    assert statuses == [200, 200, 200]
    # Each later request met the closing of the connection before, and was sent again on a new one.
    assert (server.closed_unanswered, server.connections) == (2, 3)


def test_the_server_closing_every_connection_unanswered_is_still_an_error():
    async def run() -> None:
        async def hang_up(reader, writer) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.close()

        server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
        up = Upstream(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        try:
            with pytest.raises(aiohttp.ServerDisconnectedError):
                await up.send("/v1/completions", b"{}", {}, up.stream_timeout)
        finally:
            await up.close()
            server.close()

    asyncio.run(run())


def test_an_engine_refusal_before_any_token_is_the_clients_error():
    frame = {"error": {"message": "The decoder prompt (length 9) is longer than the maximum model length of 8.",
                       "type": "BadRequestError", "param": None, "code": 400}}
    error = _upstream_error("http://v:8000", frame, 0)
    assert isinstance(error, BackendError)
    assert (error.status, error.code, error.message) == (400, "upstream_rejected", frame["error"]["message"])
    # After tokens went out, or a failure of the server's own: the server's fault, said as such.
    late = _upstream_error("http://v:8000", frame, 3)
    assert (late.status, late.code) == (502, "upstream_error")
    assert late.message.startswith("the vLLM server at http://v:8000 failed after 3 tokens: The decoder prompt")
    crash = {"error": {"message": "Internal server error", "type": "InternalServerError", "param": None, "code": 500}}
    assert _upstream_error("http://v:8000", crash, 0).status == 502


def test_the_weights_that_sampled_an_answer_are_read_as_vllm_says_them():
    from looptrace.backends.vllm import protocol

    # vLLM 0.32's generate route, last chunk: spans of output tokens, each sampled by one version.
    assert protocol.weight_versions([{"version": "step-3", "start": 0, "end": 12}]) == "step-3"
    assert protocol.weight_versions([{"version": "step-3", "start": 0, "end": 5},
                                     {"version": "step-4", "start": 5, "end": 12}]) == "step-3,step-4"
    assert protocol.weight_versions(None) is None and protocol.weight_versions([]) is None
    # What is not a printable label of at most 256 characters is not taken: it goes on spans and into exports.
    for hostile in ("", "a\nb", "\x1b[31m", "x" * 257, 3, None, ["v"]):
        assert protocol.weight_versions([{"version": hostile, "start": 0, "end": 1}]) is None, hostile


def test_weight_info_is_read_where_offered_and_asked_no_more_where_not():
    from aiohttp import web

    async def run() -> tuple:
        answers = iter([(200, {"weight_version": "step-9"}), (404, {"detail": "Not Found"})])
        asked = []

        async def weight_info(request):
            asked.append(request.path)
            status, body = next(answers)
            return web.json_response(body, status=status)

        app = web.Application()
        app.router.add_get("/weight_info", weight_info)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        upstream = Upstream(f"http://127.0.0.1:{port}")
        try:
            await upstream.read_weight_version()
            first = upstream.weight_version
            await upstream.read_weight_version()  # a 404: a vLLM not in its dev mode has no RL routes
            second = upstream.weight_version
            await upstream.read_weight_version()  # not asked again
        finally:
            await upstream.close()
            await runner.cleanup()
        return first, second, len(asked)

    assert asyncio.run(run()) == ("step-9", None, 2)


def test_a_chunk_reads_as_json_reads_it_minus_infinity_logprobs_included():
    import json
    import math

    ordinary = (b'{"id":"gen-1","created":1765000000,"choices":[{"index":0,"token_ids":[248045],'
                b'"logprobs":{"content":[{"token":"token_id:248045","logprob":-0.0012345678901234567,'
                b'"top_logprobs":[{"token":"token_id:12","logprob":-7.25}]}]},"finish_reason":null}]}')
    assert read_chunk(ordinary) == json.loads(ordinary)
    # Python's json writes a -inf logprob as -Infinity (a vLLM server built on it sends that): still read.
    refused_by_orjson = b'{"choices":[{"token_ids":[7],"logprobs":{"content":[{"logprob":-Infinity}]}}]}'
    assert read_chunk(refused_by_orjson)["choices"][0]["logprobs"]["content"][0]["logprob"] == -math.inf
    with pytest.raises(ValueError):
        read_chunk(b'{"choices": [')  # not JSON: the backend's protocol error, as before
