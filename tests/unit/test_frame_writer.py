"""proxy/api/streaming.FrameWriter: frames made in one run of the handler leave in one write, in
order, none late, none lost; a client that left is heard of; the client's pace holds the handler, for at
most the write timeout."""

from __future__ import annotations

import asyncio

import pytest

from looptrace.proxy.api import streaming
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
