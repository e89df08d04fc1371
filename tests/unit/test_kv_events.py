"""Following a vLLM server's KV events (backends/vllm/routing/kv_events.py) through what a real publisher will not do
on demand: batches published before looptrace subscribed, a seq gap the replay socket fills, one nothing
fills, a publisher that restarts (its seq from 0, its cache empty), one that goes silent while the server
serves, a reset (AllBlocksCleared), and a payload of another format. The publisher is the vLLM double's
(tests/support/kv_publisher.py: vLLM's wire format, checked against a real vLLM in
tests/integration/test_real_vllm_routing.py), on ipc:// sockets in the test's folder."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from looptrace.backends.vllm.routing import PromptBlocks, kv_events
from looptrace.backends.vllm.routing.kv_events import KVEvents

from kv_publisher import PrefixCache, Publisher
from waiting import wait_until_async


class Server:
    """A prefix cache publishing its events, as the double's."""

    def __init__(self, folder, replay: bool = True) -> None:
        self.endpoint, self.replay = f"ipc://{folder}/events", f"ipc://{folder}/replay" if replay else None
        self.cache = PrefixCache(block_size=16, capacity=50)
        self.publisher = Publisher(self.endpoint, self.replay, "kv-events")

    def request(self, prompt: list[int]) -> int:
        cached = self.cache.lookup(prompt)
        self.publisher.publish(self.cache.store(prompt, cached // 16))
        return cached


def prompt(n: int, length: int = 64) -> list[int]:
    return [n * 1000 + i for i in range(length)]


def run(test):
    """An async test on a loop of its own, the reader started and stopped around it."""
    async def main(folder, replay):
        server = Server(folder, replay)
        events = KVEvents("a:1", server.endpoint, server.replay)
        task = asyncio.create_task(events.run())
        try:
            await test(server, events)
        finally:
            task.cancel()
            server.publisher.close()
    return main


async def subscribed(events: KVEvents, server: Server) -> None:
    """Following, and its subscription arrived at the publisher: ZeroMQ's SUB receives only what is
    published after it is connected and subscribed (a reader with a replay socket asks for what came
    before; one without cannot)."""
    await wait_until_async(lambda: events.state == "following")
    await server.publisher.subscribed()


def predicts(events: KVEvents, server: Server, tokens: list[int]) -> bool:
    """The index predicts what the server's cache would find for this prompt now."""
    return events.index.cached_tokens(PromptBlocks(tokens)) == server.cache.lookup(list(tokens))


def test_what_was_published_before_it_subscribed_is_read_through_the_replay(tmp_path):
    async def main():
        server = Server(tmp_path)
        for n in range(3):
            server.request(prompt(n))
        events = KVEvents("a:1", server.endpoint, server.replay)
        task = asyncio.create_task(events.run())
        try:
            await wait_until_async(lambda: events.batches == 3)
            assert events.replayed == 3 and events.lost == 0 and events.trusted
            assert all(predicts(events, server, prompt(n) + [1]) for n in range(3))
            server.request(prompt(4))  # and then what it publishes live
            await wait_until_async(lambda: events.batches == 4)
            assert predicts(events, server, prompt(4) + [1]) and events.next_seq == 4
        finally:
            task.cancel()
            server.publisher.close()

    asyncio.run(main())


def test_a_gap_is_filled_from_the_replay_socket(tmp_path):
    async def test(server, events):
        await wait_until_async(lambda: events.state == "following")
        server.request(prompt(0))
        server.publisher.dropping = 2  # two batches kept for replay but never sent
        server.request(prompt(1))
        server.request(prompt(2))
        server.request(prompt(3))
        await wait_until_async(lambda: events.batches == 4)
        assert (events.gaps, events.lost, events.next_seq) == (1, 0, 4)
        assert all(predicts(events, server, prompt(n) + [9]) for n in range(4))

    asyncio.run(run(test)(tmp_path, True))


def test_a_gap_nothing_fills_is_counted_lost_and_followed_from_there(tmp_path):
    async def test(server, events):
        await wait_until_async(lambda: events.state == "following")
        server.request(prompt(0))
        server.publisher.dropping = 1
        server.request(prompt(1))
        server.publisher.buffer.clear()  # the server no longer keeps it
        server.request(prompt(2))
        await wait_until_async(lambda: events.batches == 2)
        assert events.lost >= 1 and events.trusted
        assert predicts(events, server, prompt(2) + [9]) and predicts(events, server, prompt(0) + [9])
        assert events.index.cached_tokens(PromptBlocks(prompt(1) + [9])) == 0  # its blocks are unknown

    asyncio.run(run(test)(tmp_path, True))


def test_without_a_replay_socket_a_gap_is_lost(tmp_path):
    async def test(server, events):
        await subscribed(events, server)
        server.request(prompt(0))
        await wait_until_async(lambda: events.batches == 1)
        server.publisher.dropping = 1
        server.request(prompt(1))
        server.request(prompt(2))
        await wait_until_async(lambda: events.batches == 2)
        assert (events.gaps, events.lost) == (1, 1)

    asyncio.run(run(test)(tmp_path, False))


def test_a_restarted_publisher_empties_the_index_and_it_is_read_again(tmp_path):
    async def test(server, events):
        for n in range(3):
            server.request(prompt(n))
        await wait_until_async(lambda: events.batches == 3)
        assert events.index.cached_tokens(PromptBlocks(prompt(0) + [9])) == 64
        server.publisher.restart()  # a new vLLM: seq from 0, cache empty
        server.cache.clear()
        server.request(prompt(5))
        await wait_until_async(lambda: events.restarts == 1 and events.next_seq == 1)
        assert events.index.cached_tokens(PromptBlocks(prompt(0) + [9])) == 0
        assert predicts(events, server, prompt(5) + [9])

    asyncio.run(run(test)(tmp_path, True))


def test_a_reset_clears_the_index(tmp_path):
    async def test(server, events):
        server.request(prompt(0))
        await wait_until_async(lambda: events.batches == 1)
        server.publisher.publish(server.cache.clear())  # AllBlocksCleared
        await wait_until_async(lambda: events.batches == 2)
        assert len(events.index) == 0 and predicts(events, server, prompt(0) + [9])

    asyncio.run(run(test)(tmp_path, True))


def test_a_silent_publisher_is_not_trusted_until_it_speaks_again(tmp_path, monkeypatch):
    monkeypatch.setattr(kv_events, "SILENT_SECONDS", 0.2)

    async def test(server, events):
        await wait_until_async(lambda: events.state == "following")
        started = time.monotonic()
        server.publisher.publishing = False  # its thread died; the server serves on
        server.request(prompt(0))
        events.owed(True, started)  # the request ended having stored blocks, and no batch came meanwhile
        assert events.trusted
        await wait_until_async(lambda: not events.trusted)
        assert "silent_seconds" in events.health()
        server.publisher.publishing = True
        server.request(prompt(1))
        await wait_until_async(lambda: events.trusted)

    asyncio.run(run(test)(tmp_path, True))


def test_a_request_whose_events_came_while_it_ran_owes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(kv_events, "SILENT_SECONDS", 0.2)

    async def test(server, events):
        await wait_until_async(lambda: events.state == "following")
        started = time.monotonic()
        server.request(prompt(0))
        await wait_until_async(lambda: events.batches == 1)
        events.owed(True, started)  # its blocks' batch came before it ended
        later = time.monotonic() + 1  # the silence allowed (0.2 s) has passed: nothing was owed
        monkeypatch.setattr(kv_events, "time", SimpleNamespace(monotonic=lambda: later))
        assert events.trusted

    asyncio.run(run(test)(tmp_path, True))


def test_the_next_request_waits_for_the_batch_that_stores_what_the_last_one_filled(tmp_path, monkeypatch):
    # The real-vLLM hybrid test (a clean-clone CI run, 2026-12-05): on a busy machine vLLM's publisher thread sent a
    # turn's batch after its answer, the next turn was routed before it and predicted 480 tokens short.
    monkeypatch.setattr(kv_events, "AWAIT_SECONDS", 30.0)  # returning at all means the batch was read, not a timeout

    async def test(server, events):
        await subscribed(events, server)
        started = time.monotonic()
        batch = server.cache.store(prompt(0), 0)  # stored as the request ran; its batch not sent yet
        events.owed(True, started, PromptBlocks(prompt(0)).key(16, 3))
        asyncio.get_running_loop().call_later(0.2, server.publisher.publish, batch)
        await events.settled()
        assert predicts(events, server, prompt(0) + [9]) and events.index.cached_tokens(PromptBlocks(prompt(0) + [9]))
        assert not events._awaited

    asyncio.run(run(test)(tmp_path, True))


def test_a_batch_made_after_the_request_ended_ends_the_wait(tmp_path, monkeypatch):
    """Its last block stored and evicted again before the next request: a later batch says the server moved on."""
    monkeypatch.setattr(kv_events, "AWAIT_SECONDS", 30.0)

    async def test(server, events):
        await subscribed(events, server)
        started = time.monotonic()
        events.owed(True, started, PromptBlocks(prompt(0)).key(16, 3))  # its blocks' events lost to the test
        asyncio.get_running_loop().call_later(0.2, server.request, prompt(1))  # a batch made after it ended
        await events.settled()
        assert events.batches == 1 and not events._awaited

    asyncio.run(run(test)(tmp_path, True))


def test_a_batch_that_never_comes_is_waited_for_at_most_await_seconds(tmp_path, monkeypatch):
    monkeypatch.setattr(kv_events, "AWAIT_SECONDS", 0.2)

    async def test(server, events):
        await subscribed(events, server)
        events.owed(True, time.monotonic(), PromptBlocks(prompt(0)).key(16, 3))  # the publisher's thread died
        waited = time.monotonic()
        await events.settled()
        assert time.monotonic() - waited >= 0.15 and not events._awaited
        events.owed(True, time.monotonic())  # a request with media: none of its blocks to wait for
        assert not events._awaited

    asyncio.run(run(test)(tmp_path, True))


def test_a_payload_of_another_format_is_said_and_not_used(tmp_path):
    async def test(server, events):
        await wait_until_async(lambda: events.state == "following")
        server.publisher._pub.send_multipart((b"kv-events", (0).to_bytes(8, "big"), b"\x93not msgpack"))
        await wait_until_async(lambda: events.state == "unreadable")
        assert not events.trusted and "could not be read" in events.error

    asyncio.run(run(test)(tmp_path, True))


@pytest.mark.parametrize("replay", [True, False])
def test_health_says_how_it_follows(tmp_path, replay):
    async def test(server, events):
        await subscribed(events, server)
        server.request(prompt(0))
        await wait_until_async(lambda: events.batches == 1)
        health = events.health()
        assert health["state"] == "following" and health["blocks"] == 4 and health["block_size"] == 16
        assert health["replay_endpoint"] == server.replay

    asyncio.run(run(test)(tmp_path, replay))
