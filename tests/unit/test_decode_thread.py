"""The decode thread the llama.cpp backend runs on: first in, first out, a 429 past the queue's bound,
cancellation seen by the decode function, and failures that reach the client while the thread lives on."""

from __future__ import annotations

import asyncio
import threading

import pytest

from looptrace.backends.base import BackendError, Busy, DecodeRequest, SamplingParams
from looptrace.backends.decode_thread import DecodeThread
from looptrace.backends.events import done_event, prefill_event, token_event

from waiting import wait_until_async


def request(*prompt: int) -> DecodeRequest:
    return DecodeRequest(list(prompt), 4, SamplingParams(temperature=0), frozenset())


def echo(gate: threading.Event | None = None, seen: list | None = None, started: threading.Event | None = None):
    """A decode function: one token per prompt id, stopping early when cancelled; sets `started` once a
    request is on the thread, and waits for `gate` before its first token, if given."""

    def decode(req: DecodeRequest, emit) -> None:
        if seen is not None:
            seen.append(req.prompt_ids[0])
        emit(prefill_event(len(req.prompt_ids), 0, 0.0))
        if started is not None:
            started.set()
        if gate is not None:
            gate.wait(10)
        for i, token in enumerate(req.prompt_ids):
            if req.cancel.is_set():
                emit(done_event("cancelled", i, 0.0, cached_tokens=0))
                return
            emit(token_event(i, token, "", "", False, 0.0, 1, [token], [0.0]))
        emit(done_event("stop", len(req.prompt_ids), 0.0, cached_tokens=0))

    return decode


async def collect(thread: DecodeThread, req: DecodeRequest) -> list[dict]:
    return [event async for event in thread.generate(req)]


def test_requests_run_in_order_of_arrival():
    async def main():
        seen: list[int] = []
        thread = DecodeThread(echo(seen=seen), max_queue=8, name="test")
        results = await asyncio.gather(*(collect(thread, request(n, n + 1)) for n in (10, 20, 30)))
        await thread.close()
        return seen, results

    seen, results = asyncio.run(main())
    assert seen == [10, 20, 30]
    assert [[e["id"] for e in r if e["type"] == "token"] for r in results] == [[10, 11], [20, 21], [30, 31]]
    assert all(r[0]["type"] == "prefill" and r[-1]["finish_reason"] == "stop" for r in results)


def test_past_the_queue_a_request_is_refused_with_a_429():
    async def main():
        gate, started = threading.Event(), threading.Event()
        thread = DecodeThread(echo(gate, started=started), max_queue=1, name="test")
        running = asyncio.ensure_future(collect(thread, request(1)))
        await wait_until_async(started.is_set, 10)  # the first is on the thread, held at the gate
        waiting = asyncio.ensure_future(collect(thread, request(2)))
        await wait_until_async(lambda: thread.waiting == 1, 10)  # the second in the queue's one place
        with pytest.raises(Busy) as refused:
            await collect(thread, request(3))
        gate.set()
        done = await asyncio.gather(running, waiting)
        await thread.close()
        return refused.value, done

    refused, done = asyncio.run(main())
    assert refused.status == 429 and refused.code == "queue_full"
    assert [r[-1]["finish_reason"] for r in done] == ["stop", "stop"]


def test_a_consumer_that_leaves_stops_the_decoding():
    async def main():
        gate = threading.Event()
        thread = DecodeThread(echo(gate), max_queue=4, name="test")
        req = request(*range(100))
        stream = thread.generate(req)
        first = await stream.__anext__()
        await stream.aclose()  # the client went away after the prefill
        gate.set()
        after = await collect(thread, request(7))  # first in, first out: after the cancelled one ended
        await thread.close()
        return first, req.cancel.is_set(), after

    first, cancelled, after = asyncio.run(main())
    assert first["type"] == "prefill" and cancelled
    assert [e["id"] for e in after if e["type"] == "token"] == [7]


def test_a_failure_reaches_the_client_and_the_thread_lives_on(caplog):
    def decode(req: DecodeRequest, emit) -> None:
        if req.prompt_ids == [0]:
            raise RuntimeError("the model fell over")
        if req.prompt_ids == [1]:
            raise BackendError("too long", status=400, code="context_length_exceeded")
        echo()(req, emit)

    async def main():
        thread = DecodeThread(decode, max_queue=4, name="test")
        failures = []
        for prompt in (0, 1):
            with pytest.raises(BackendError) as failed:
                await collect(thread, request(prompt))
            failures.append(failed.value)
        after = await collect(thread, request(5))
        await thread.close()
        return failures, after

    (crashed, refused), after = asyncio.run(main())
    assert (crashed.status, crashed.code) == (500, "decode_failed") and "the model fell over" not in crashed.message
    assert any("the model fell over" in str(r.exc_info[1]) for r in caplog.records if r.exc_info)  # the log's
    assert (refused.status, refused.code) == (400, "context_length_exceeded")
    assert after[-1]["finish_reason"] == "stop"


def test_call_runs_on_the_thread_after_what_was_queued():
    thread = DecodeThread(echo(), max_queue=4, name="test")
    assert thread.call(lambda: threading.current_thread().name) == "looptrace-test"
    with pytest.raises(ZeroDivisionError):
        thread.call(lambda: 1 / 0)
    assert asyncio.run(thread.close())
