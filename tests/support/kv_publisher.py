"""The vLLM double's prefix cache and its KV-event publisher, as vLLM 0.32 keeps and publishes them
(vllm/v1/core/block_pool.py, vllm/distributed/kv_events.py; the messages are checked against a real
vLLM's in tests/integration/test_real_vllm_routing.py).

PrefixCache: whole blocks of `block_size` tokens, each found by a hash chained over the blocks before it.
A request finds the longest prefix of its prompt cached (its last token is always computed again),
then its prompt's other whole blocks are stored, and at its end the blocks its answer filled; past
`capacity` blocks the least recently used is evicted. Each change is an event: BlockStored (the
blocks' hashes, the parent's, their tokens), BlockRemoved (one hash each), AllBlocksCleared (a reset).

Publisher: a ZeroMQ PUB socket sending `[topic, seq, msgpack EventBatch]` and a ROUTER answering a
start seq with every batch it keeps from there, then the end marker, as vLLM's ZmqEventPublisher.
What a real publisher will not do on demand, switched by the double's POST /double/kv_events:
    {"publish": false}   it stops: nothing is sent and seq stays (a dead publisher thread); true again
    {"drop": N}          the next N batches are kept for replay but not sent (a gap the replay fills)
    {"forget": true}     the replay buffer is emptied (with a drop: a gap nothing fills)
    {"restart": true}    seq from 0 again, buffer and cache emptied: a restarted server
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from array import array
from collections import OrderedDict, deque

import msgpack
import zmq
import zmq.asyncio

END_SEQ = (-1).to_bytes(8, "big", signed=True)
BUFFER_STEPS = 10_000  # vLLM's default replay buffer


class PrefixCache:
    def __init__(self, block_size: int, capacity: int | None = None) -> None:
        self.block_size = block_size
        self.capacity = capacity
        self.blocks: OrderedDict[int, None] = OrderedDict()  # held blocks, least recently used first

    def _hashes(self, tokens: list[int], upto: int) -> list[int]:
        """The chained hashes of the first `upto` whole blocks: sha256 over the parent's and the block's tokens,
        published as vLLM does by default (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES): its low 64 bits as an int."""
        out, parent, size = [], b"", self.block_size
        for n in range(upto):
            parent = hashlib.sha256(parent + array("q", tokens[n * size:(n + 1) * size]).tobytes()).digest()
            out.append(int.from_bytes(parent, "big") & (2**64 - 1))
        return out

    def lookup(self, prompt: list[int]) -> int:
        """Prompt tokens found cached (whole blocks, the last token left to compute), now most recently used."""
        found = 0
        for block_hash in self._hashes(prompt, (len(prompt) - 1) // self.block_size):
            if block_hash not in self.blocks:
                break
            self.blocks.move_to_end(block_hash)
            found += 1
        return found * self.block_size

    def store(self, tokens: list[int], cached_blocks: int) -> list[dict]:
        """The whole blocks of `tokens` after the first `cached_blocks` stored, least recently used evicted:
        the events that says."""
        size = self.block_size
        hashes = self._hashes(tokens, len(tokens) // size)
        new = hashes[cached_blocks:]
        if not new:
            return []
        for block_hash in new:
            self.blocks[block_hash] = None
            self.blocks.move_to_end(block_hash)
        events = [{"type": "BlockStored", "block_hashes": new,
                   "parent_block_hash": hashes[cached_blocks - 1] if cached_blocks else None,
                   "token_ids": tokens[cached_blocks * size:len(hashes) * size], "block_size": size,
                   "lora_id": None, "medium": "GPU", "lora_name": None, "extra_keys": [None] * len(new),
                   "group_idx": 0, "kv_cache_spec_kind": "full_attention"}]
        while self.capacity is not None and len(self.blocks) > self.capacity:
            evicted, _ = self.blocks.popitem(last=False)
            events.append({"type": "BlockRemoved", "block_hashes": [evicted], "medium": "GPU", "group_idx": 0})
        return events

    def clear(self) -> list[dict]:
        self.blocks.clear()
        return [{"type": "AllBlocksCleared"}]


class Publisher:
    def __init__(self, endpoint: str, replay_endpoint: str | None, topic: str = "") -> None:
        self.endpoint, self.replay_endpoint, self.topic = endpoint, replay_endpoint, topic.encode()
        self.seq = 0
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=BUFFER_STEPS)
        self.publishing, self.dropping = True, 0
        self._context = zmq.asyncio.Context.instance()
        # XPUB: vLLM's PUB on the wire, and it tells when a subscriber's subscription arrived (subscribed()).
        self._pub = self._context.socket(zmq.XPUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.bind(endpoint)
        self._router = None
        self._task = None
        if replay_endpoint:
            self._router = self._context.socket(zmq.ROUTER)
            self._router.setsockopt(zmq.LINGER, 0)
            self._router.bind(replay_endpoint)
            self._task = asyncio.get_running_loop().create_task(self._serve_replays())

    async def subscribed(self, timeout: float = 10.0) -> None:
        """Until a subscriber's subscription reached this socket: what is published after it is received
        (ZeroMQ's SUB takes only what is published once it is connected and subscribed)."""
        while True:
            frame = await asyncio.wait_for(self._pub.recv(), timeout)
            if frame[:1] == b"\x01":
                return

    def publish(self, events: list[dict]) -> None:
        if not events or not self.publishing:
            return
        payload = msgpack.packb([time.time(), events, 0], use_bin_type=True)
        seq, self.seq = self.seq, self.seq + 1
        self.buffer.append((seq, payload))
        if self.dropping:
            self.dropping -= 1
            return
        self._pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload))

    async def _serve_replays(self) -> None:
        while True:
            frames = await self._router.recv_multipart()
            if len(frames) != 3:
                continue  # vLLM logs "Invalid replay request" and answers nothing
            client, _, start = frames
            start_seq = int.from_bytes(start, "big")
            for seq, payload in list(self.buffer):
                if seq >= start_seq:
                    await self._router.send_multipart((client, b"", self.topic, seq.to_bytes(8, "big"), payload))
            await self._router.send_multipart((client, b"", b"", END_SEQ, b""))

    def restart(self) -> None:
        self.seq = 0
        self.buffer.clear()

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._pub.close()
        if self._router is not None:
            self._router.close()
