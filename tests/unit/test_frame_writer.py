"""proxy/api/streaming.FrameWriter: frames made in one run of the handler leave in one write, in
order, none late, none lost; a client that left is heard of; the client's pace holds the handler, for at
most the write timeout. And the transports' framings of a format's events: SSE's lines, a WebSocket's
messages."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import WSMsgType

from looptrace.proxy.api import streaming
from looptrace.proxy.api.openai.responses.request import ToolNames
from looptrace.proxy.api.openai.responses.stream import ResponseBuilder
from looptrace.proxy.api.openai.responses.websocket import Frames
from looptrace.proxy.api.streaming import FrameWriter


class Response:
    """What FrameWriter uses of aiohttp's StreamResponse: `write`, recorded; optionally slow to drain or
    broken."""

    def __init__(self, *, delay: float = 0.0, fail_after: int | None = None) -> None:
        self.writes: list[bytes] = []
        self.delay = delay
        self.fail_after = fail_after

    async def write(self, data: bytes) -> None:
        if self.fail_after is not None and len(self.writes) >= self.fail_after:
            raise ConnectionResetError("the client went away")
        self.writes.append(data)  # sent, as aiohttp sends at once; then the drain
        await asyncio.sleep(self.delay)


def test_a_burst_goes_out_in_one_write_and_nothing_waits_for_the_next():
    async def run():
        response = Response()
        out = FrameWriter(response)
        for i in range(5):  # one run of the handler: five tokens from one read
            await out.write(b"frame %d\n" % i)
        assert response.writes == []  # queued only: the handler has not waited yet
        await asyncio.sleep(0)  # the handler waits (for the next read): the burst leaves at once
        assert response.writes == [b"frame 0\nframe 1\nframe 2\nframe 3\nframe 4\n"]
        await out.write(b"frame 5\n")
        await out.flush()
        out.close()
        return response.writes

    assert asyncio.run(run())[1:] == [b"frame 5\n"]


def test_frames_keep_their_order_while_a_write_is_under_way():
    async def run():
        response = Response(delay=0.01)
        out = FrameWriter(response)
        for i in range(30):
            await out.write(b"%d," % i)
            if i % 7 == 0:
                await asyncio.sleep(0.003)  # some arrive while the previous write is still going
        await out.flush()
        out.close()
        return response.writes

    writes = asyncio.run(run())
    assert b"".join(writes) == b"".join(b"%d," % i for i in range(30))
    assert 1 < len(writes) < 30


def test_a_client_that_left_is_heard_of_by_the_next_write_or_the_flush():
    async def run(then_flush: bool):
        out = FrameWriter(Response(fail_after=0))
        await out.write(b"first")
        await asyncio.sleep(0)  # the write fails in the background
        try:
            with pytest.raises(ConnectionResetError):
                await (out.flush() if then_flush else out.write(b"second"))
        finally:
            out.close()

    asyncio.run(run(False))
    asyncio.run(run(True))


def test_a_slow_client_holds_the_handler_past_the_bound(monkeypatch):
    monkeypatch.setattr(streaming, "HELD_BYTES", 100)

    async def run():
        response = Response(delay=0.05)
        out = FrameWriter(response)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await out.write(b"x" * 60)
        await asyncio.sleep(0)  # the first write is under way (50 ms)
        await out.write(b"y" * 60)  # 60 held: under the bound, no wait
        assert loop.time() - started < 0.04
        await out.write(b"z" * 60)  # 120 held: waits for the client
        waited = loop.time() - started
        await out.flush()
        out.close()
        return waited, b"".join(response.writes)

    waited, sent = asyncio.run(run())
    assert waited >= 0.045
    assert sent == b"x" * 60 + b"y" * 60 + b"z" * 60


def test_close_stops_a_write_under_way():
    async def run():
        response = Response(delay=10)
        out = FrameWriter(response)
        await out.write(b"never")
        await asyncio.sleep(0)
        out.close()
        await asyncio.sleep(0)
        return out._sending

    sending = asyncio.run(run())
    assert sending.cancelled()


def test_the_opening_and_the_first_token_leave_together_without_waiting_a_turn():
    async def run(first_is_here: bool):
        response = Response()
        out = FrameWriter(response)
        first = asyncio.get_running_loop().create_future()
        if first_is_here:
            first.set_result("token")
        await out.opening(b"start\n", first)
        await out.write_now(b"token 0\n")
        sent_before_any_turn = list(response.writes)
        await out.write(b"token 1\n")
        await out.flush()
        out.close()
        return sent_before_any_turn, response.writes

    # The first token is here: the opening waits for it, and both go out in one write, before the
    # handler gives the loop a turn (at 64 streams a turn is a whole round of the other streams).
    before, writes = asyncio.run(run(True))
    assert before == [b"start\ntoken 0\n"] and writes == [b"start\ntoken 0\n", b"token 1\n"]
    # Still waiting for the model: the opening goes at once, so the client sees the stream begin.
    before, writes = asyncio.run(run(False))
    assert b"".join(writes) == b"start\ntoken 0\ntoken 1\n" and writes[0].startswith(b"start\n")


class Transport:
    aborted = False

    def abort(self) -> None:
        self.aborted = True


@pytest.mark.parametrize("waiting_in", ["write", "flush", "write_now"])
def test_a_write_the_client_takes_nothing_of_past_the_write_timeout_drops_it(monkeypatch, waiting_in):
    # Issue 35: aiohttp has no write timeout, so a client that stopped reading held the handler (and
    # the model) for as long as the answer ran. Whether the handler is writing the next tokens, flushing
    # at the end, or writing the first token in place, the client is dropped after the bound.
    monkeypatch.setattr(streaming, "HELD_BYTES", 10**9)  # never held back by size: the bound alone acts

    async def run():
        transport = Transport()
        out = FrameWriter(Response(delay=10), write_timeout=0.2, transport=transport)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(streaming.ClientStoppedReading):
            if waiting_in == "write_now":
                await out.write_now(b"first token")
            else:
                await out.write(b"first")
                await asyncio.sleep(0)  # under way, and never taken
                if waiting_in == "flush":
                    await out.flush()
                else:
                    while True:  # tokens keep coming; each write looks at how long the one under way took
                        await asyncio.sleep(0.02)
                        await out.write(b"more")
        out.close()
        return loop.time() - started, transport.aborted

    waited, aborted = asyncio.run(run())
    assert 0.2 <= waited < 1.0 and aborted


def test_a_slow_client_within_the_write_timeout_is_waited_for():
    async def run():
        response = Response(delay=0.05)  # each write taken in 50 ms: slow, never stopped
        out = FrameWriter(response, write_timeout=0.2, transport=Transport())
        for i in range(20):
            await out.write(b"%d," % i)
            await asyncio.sleep(0.02)
        await out.flush()
        out.close()
        return b"".join(response.writes)

    assert asyncio.run(run()) == b"".join(b"%d," % i for i in range(20))


# Events framed by the transport (issue 54): a format makes (name, JSON) events; SSE adds its lines,
# a WebSocket sends each JSON as a message with the lane's stream_id in it. Nothing un-formats a frame.

def test_sse_frames_named_and_unnamed_events_and_ends_an_openai_stream_with_done():
    sse = streaming.SSE()
    delta = ("response.output_text.delta", b'{"type":"response.output_text.delta","delta":"Hi"}')
    assert sse.frames([delta]) == (b'event: response.output_text.delta\ndata: '
                                   b'{"type":"response.output_text.delta","delta":"Hi"}\n\n',)
    chunk = (None, b'{"choices":[]}')  # Chat Completions names no events
    assert sse.frames([chunk, chunk]) == (b'data: {"choices":[]}\n\ndata: {"choices":[]}\n\n',)
    assert sse.frames([]) == ()
    assert sse.end([chunk], done=True) == (b'data: {"choices":[]}\n\ndata: [DONE]\n\n',)
    assert sse.end([("message_stop", b'{"type":"message_stop"}')], done=False) == (
        b'event: message_stop\ndata: {"type":"message_stop"}\n\n',)
    # A silence: the format's keepalive events, or SSE's comment where the API has none of its own.
    assert sse.keepalive([]) == (streaming.SSE_KEEPALIVE,) == (b": keepalive\n\n",)
    assert sse.keepalive([("ping", b'{"type":"ping"}')]) == (b'event: ping\ndata: {"type":"ping"}\n\n',)


class Socket:
    """What websocket.Frames uses of aiohttp's WebSocketResponse: `send_frame`, recorded."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, object]] = []

    async def send_frame(self, data: bytes, kind) -> None:
        self.sent.append((data, kind))


def test_a_websocket_sends_each_events_json_with_its_lane_as_a_field_and_no_sse():
    builder = ResponseBuilder("m", ToolNames(), {}, stream=True)
    events = builder.start() + builder.text({"type": "text", "text": 'a "quoted"\n\n data: [DONE]'})
    events += builder.without_output()

    async def run(lane):
        ws = Socket()
        frames = Frames(ws, lane)
        out = FrameWriter(frames, messages=True)
        # The relay's calls: end() and keepalive() add nothing of SSE's (no [DONE], no comment).
        await out.write(*frames.frames(events[:2]))
        await out.write(*frames.keepalive([]))
        await out.write(*frames.end(events[2:], done=True))
        await out.flush()
        out.close()
        return ws.sent

    for lane in (None, "lane-1"):
        sent = asyncio.run(run(lane))
        assert all(kind == WSMsgType.TEXT for _, kind in sent)
        messages = [json.loads(data) for data, _ in sent]  # each one JSON object, [DONE] never among them
        assert [m["type"] for m in messages] == [name for name, _ in events]
        if lane is None:
            assert all("stream_id" not in m for m in messages)
            assert [data for data, _ in sent] == [data for _, data in events]
        else:  # the lane is the object's first field: inserted after the brace the format wrote
            assert all(data.startswith(b'{"stream_id":"lane-1","type":') for data, _ in sent)
            assert [{k: v for k, v in m.items() if k != "stream_id"} for m in messages] == \
                [json.loads(data) for _, data in events]
        text = [m for m in messages if m["type"] == "response.output_text.delta"]
        assert text[0]["delta"] == 'a "quoted"\n\n data: [DONE]'


def test_a_burst_of_messages_reaches_the_sink_as_one_list_in_order():
    class Sink:
        def __init__(self) -> None:
            self.bursts: list[list[bytes]] = []

        async def write(self, burst: list[bytes]) -> None:
            self.bursts.append(list(burst))

    async def run():
        sink = Sink()
        out = FrameWriter(sink, messages=True)
        first = asyncio.get_running_loop().create_future()
        first.set_result("token")
        await out.opening(b"created", first)
        await out.opening(b"in_progress", first)
        await out.write_now(b"item added", b"delta 0")  # in place, with the opening: one burst
        before_any_turn = list(sink.bursts)
        for i in range(1, 4):
            await out.write(b"delta %d" % i)
        await out.flush()
        out.close()
        return before_any_turn, sink.bursts

    before, bursts = asyncio.run(run())
    assert before == [[b"created", b"in_progress", b"item added", b"delta 0"]]
    assert bursts == [before[0], [b"delta 1", b"delta 2", b"delta 3"]]


@pytest.mark.parametrize("first_frame", [b"data: token 0\n\n", None])
def test_the_headers_leave_with_the_first_frame_in_one_write_of_the_socket(first_frame):
    from aiohttp import ClientSession, web
    from aiohttp.test_utils import TestServer

    writes: list[bytes] = []

    async def steps():
        yield "token"

    async def handler(request: web.Request) -> web.StreamResponse:
        transport = request.transport
        write, writelines = transport.write, transport.writelines
        transport.write = lambda data: (writes.append(bytes(data)), write(data))[1]
        transport.writelines = lambda parts: (writes.append(b"".join(parts)), writelines(parts))[1]
        async with streaming.opened_stream(request, steps(), None) as (response, _, first, out, _):
            await first
            await out.write_now(*([first_frame] if first_frame else []))
            sent_before_any_turn = list(writes)
            await out.write(b"data: [DONE]\n\n")
            await out.flush()
            assert sent_before_any_turn and len(sent_before_any_turn) == 1
            return response

    async def run() -> bytes:
        app = web.Application()
        app.router.add_get("/", handler)
        async with TestServer(app) as server, ClientSession() as client:
            async with client.get(server.make_url("/")) as answer:
                return await answer.read()

    body = asyncio.run(run())
    assert writes[0].startswith(b"HTTP/1.1 200") and b"text/event-stream" in writes[0]
    if first_frame:  # one write: the headers, then the first frame (chunked)
        assert writes[0].endswith(first_frame + b"\r\n")
        assert body == first_frame + b"data: [DONE]\n\n"
    else:  # nothing to send yet: the headers go at once, alone, as before
        assert writes[0].endswith(b"\r\n\r\n") and b"data:" not in writes[0]
        assert body == b"data: [DONE]\n\n"
