"""vLLM's KV-cache events from one server, read into its EventIndex (kv_index.py).

A vLLM started with `--kv-events-config` (publisher "zmq") publishes, after each engine step that changed
its prefix cache, a ZeroMQ multipart message `[topic, seq, payload]`: seq a counter from 0 (8 bytes,
big-endian), the payload a msgpack EventBatch `[ts, events, data_parallel_rank]`, each event a map tagged
by "type" (BlockStored, BlockRemoved, AllBlocksCleared; vllm/distributed/kv_events.py). Its replay
socket (a ROUTER) answers a start seq with every batch it still keeps from there, each
`[b"", topic, seq, payload]`, then an end marker (seq -1, empty payload).

What can go wrong, and what is done:

- looptrace starts after the server: every batch it still keeps is asked for first (replay from 0);
- a seq skipped (a full queue, a reconnection): the missing batches are asked for again; batches the
  server no longer keeps (or a server without a replay socket) are counted as `lost`: the index may
  miss blocks stored then, or hold blocks removed then;
- the publisher restarts (a restarted vLLM counts from 0 again, its cache empty): a seq already read
  arriving with another payload clears the index, which is read again from 0; AllBlocksCleared (vLLM's
  cache reset) clears it too;
- the server stops answering (`resync`, from the pool: it may be restarting): the index is cleared, and
  read again from 0 once the server is back;
- a request's batch sent after its answer (vLLM publishes from a thread of its own, which falls behind on a busy
  machine): the next request routed waits for the batch that stores the last block it filled (`settled`, at most
  AWAIT_SECONDS after it ended), so an agent's next turn sent at once sees what its last one stored;
- the publisher goes silent while the server serves (a request stored blocks, and no batch came within
  SILENT_SECONDS): the index is not trusted, and routing uses the estimate until batches come again;
- a payload this looptrace cannot read (another vLLM's format): said once, and the estimate is used.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections import OrderedDict

import msgpack
import zmq
import zmq.asyncio

from .kv_index import EventIndex

log = logging.getLogger("looptrace")

END_SEQ = b"\xff" * 8  # the replay's end marker: -1 as 8 bytes
REPLAY_SECONDS = 5.0  # the longest wait for each message of a replay
SILENT_SECONDS = 5.0  # a request stored blocks, and no batch came this long after it ended: not trusted
POLL_MS = 500  # how often the reader looks up from its socket (to start a replay asked for meanwhile)
SETTLE_SECONDS = 0.05  # the longest a request waits for batches already received to be read
# The longest a request waits, from the end of the one before it on the server, for the batch that stores what that
# one filled: vLLM's publisher sends from a thread of its own, which on a busy machine falls behind the answer.
AWAIT_SECONDS = 1.0
RECENT = 4096  # batches whose payload digest is kept, to tell a batch read twice from a restarted publisher


class KVEvents:
    """One server's KV-event stream and its index. `run()` reads until cancelled."""

    def __init__(self, server: str, endpoint: str, replay_endpoint: str | None) -> None:
        self.server, self.endpoint, self.replay_endpoint = server, endpoint, replay_endpoint
        self.index = EventIndex()
        self.state = "connecting"  # connecting | following | unreadable
        self.error: str | None = None
        self.next_seq: int | None = None  # the seq expected next; None: read from 0 first
        self._digests: OrderedDict[int, int] = OrderedDict()  # seq → its payload's crc32, the last RECENT
        self.batches = self.gaps = self.replayed = self.lost = self.restarts = 0
        self._owed_since: float | None = None  # a request stored blocks, and no batch came while it ran: since when
        self._last_batch_at: float | None = None
        self._last_batch_ts: float | None = None  # the server's clock (time.time) when it made the last batch read
        # Our key of the last block a request that ended filled, its batch not read yet → (until when it is waited
        # for, time.monotonic; when the request ended, time.time).
        self._awaited: dict[int, tuple[float, float]] = {}
        self._catch_up_from: int | None = None  # a replay asked for (resync)
        self._catching_up = False
        self.started = asyncio.Event()  # set once what the server kept from before was read (or could not be)
        self._sub = None
        self._context = zmq.asyncio.Context.instance()

    # -- what routing reads --

    @property
    def trusted(self) -> bool:
        owed = self._owed_since
        return self.state == "following" and (owed is None or time.monotonic() - owed < SILENT_SECONDS)

    def owed(self, stored: bool, since: float, last_block: int | None = None) -> None:
        """A request that started at `since` (time.monotonic) ended on the server; `stored`: it filled blocks the
        cache did not hold, whose events come while it runs (none came: they are owed from now, SILENT_SECONDS) —
        or just after it ends, where the publisher falls behind: the next request routed waits for the last of them,
        `last_block` (our key; None where the index could not place it: a prompt with media), in `settled`."""
        if not stored:
            return
        now = time.monotonic()
        if last_block is not None and not self.index.holds(last_block):
            self._awaited[last_block] = (now + AWAIT_SECONDS, time.time())
        last = self._last_batch_at
        if (last is None or last < since) and self._owed_since is None:
            self._owed_since = now

    def forget(self) -> None:
        """What the server held is unknown (it stopped answering, or its publisher restarted)."""
        self.index.cleared()
        self.next_seq, self._owed_since = None, None
        self._digests.clear()
        self._awaited.clear()

    def resync(self) -> None:
        """The server answers again: every batch it still keeps is read again."""
        self.forget()
        self._catch_up_from = 0

    async def settled(self) -> None:
        """What a request routed right after the last one ended should see: batches that have arrived, read (the last
        may be in the socket still, or a replay under way: at most SETTLE_SECONDS), and the batches that store what
        the requests that just ended filled, which vLLM may not have sent yet (at most AWAIT_SECONDS after each end)."""
        deadline = time.monotonic() + SETTLE_SECONDS
        while True:
            now = time.monotonic()
            arriving = self._catching_up or self._sub is not None and self._sub.getsockopt(zmq.EVENTS) & zmq.POLLIN
            if not (arriving and now <= deadline) and not self._awaiting(now):
                return
            await asyncio.sleep(0.001)

    def _awaiting(self, now: float) -> bool:
        """Whether a block an ended request filled is still awaited: not placed, no batch the server made after the
        request ended read (one that evicted it again, say), not overdue, and the reader trusted."""
        awaited = self._awaited
        if awaited:
            newest = self._last_batch_ts
            for key, (until, ended) in list(awaited.items()):
                if now > until or not self.trusted or self.index.holds(key) or newest is not None and newest >= ended:
                    del awaited[key]
        return bool(awaited)

    def health(self) -> dict:
        body = {"endpoint": self.endpoint, "replay_endpoint": self.replay_endpoint, "state": self.state,
                "trusted": self.trusted, "next_seq": self.next_seq, "blocks": len(self.index),
                "block_size": self.index.block_size, "batches": self.batches, "gaps": self.gaps,
                "replayed": self.replayed, "lost": self.lost, "restarts": self.restarts,
                "skipped_blocks": self.index.skipped}
        if len(self.index.groups) > 1:  # a hybrid model: each group's kind, and whether the prediction is exact
            body["kv_cache_groups"] = self.index.kinds()
            body["index"] = self.index.source
        if self._owed_since is not None and not self.trusted:
            body["silent_seconds"] = round(time.monotonic() - self._owed_since, 1)
        if self.error:
            body["error"] = self.error
        return body

    # -- reading --

    async def run(self) -> None:
        sub = self._context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(self.endpoint)
        self._sub = sub
        log.info("following the KV events of the vLLM server %s at %s", self.server, self.endpoint)
        try:
            await self._catch_up(0)  # what the server still keeps from before looptrace started
            self.started.set()
            while True:
                if self._catch_up_from is not None:
                    await self._catch_up(self._catch_up_from)
                if not await sub.poll(POLL_MS):
                    continue
                frames = await sub.recv_multipart()
                if self.state == "unreadable":
                    continue
                if len(frames) != 3 or len(frames[1]) != 8:
                    self._unreadable(f"a message of {len(frames)} parts, not [topic, seq, payload]")
                    continue
                await self._live(int.from_bytes(frames[1], "big"), frames[2])
        finally:
            self._sub = None
            sub.close()

    async def _live(self, seq: int, payload: bytes) -> None:
        expected = self.next_seq
        if expected is not None and seq < expected:
            if self._digests.get(seq) == zlib.crc32(payload):
                return  # read already, through a replay
            self.restarts += 1  # a publisher counting again: a restarted server, its cache empty
            log.warning("the vLLM server %s restarted its KV events (seq %d after %d): its index starts over",
                        self.server, seq, expected - 1)
            self.forget()
            expected = None
        if expected is None and seq > 0 or expected is not None and seq > expected:
            if expected is not None:
                self.gaps += 1
            await self._catch_up(expected or 0)
            if self.next_seq is not None and seq < self.next_seq:
                return  # the replay brought it
            if self.next_seq is not None and seq > self.next_seq or self.next_seq is None and seq > 0:
                self.lost += 1  # batches neither sent nor kept: followed from here on
        self._apply(seq, payload)

    async def _catch_up(self, start: int) -> None:
        """Every batch the server still keeps from `start` on, through its replay socket."""
        self._catch_up_from = None
        if self.replay_endpoint is None:  # nothing to ask: a gap is counted lost by the caller
            self.state = "following" if self.state == "connecting" else self.state
            return
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.replay_endpoint)
        first = None
        self._catching_up = True
        try:
            await sock.send_multipart([b"", start.to_bytes(8, "big")])
            while True:
                if not await sock.poll(REPLAY_SECONDS * 1000):
                    raise TimeoutError(f"the replay socket {self.replay_endpoint} did not answer in "
                                       f"{REPLAY_SECONDS:g} s")
                frames = await sock.recv_multipart()
                if len(frames) != 4 or len(frames[2]) != 8:
                    raise ValueError(f"a replay message of {len(frames)} parts, not ['', topic, seq, payload]")
                if frames[2] == END_SEQ:
                    break
                seq = int.from_bytes(frames[2], "big")
                first = seq if first is None else first
                if self.next_seq is None or seq >= self.next_seq:
                    self._apply(seq, frames[3])
                    self.replayed += 1
            if first is not None and first > start:
                self.lost += 1  # the server's buffer no longer holds what came before `first`
            if self.state == "connecting":
                self.state = "following"
        except (TimeoutError, ValueError) as exc:
            self.lost += 1
            self.error = str(exc)
            log.warning("KV events of the vLLM server %s: %s", self.server, exc)
        finally:
            self._catching_up = False
            sock.close()

    def _apply(self, seq: int, payload: bytes) -> None:
        try:
            ts, events, *_ = msgpack.unpackb(payload, raw=False, strict_map_key=False)
            for event in events:
                kind = event["type"]
                if kind == "BlockStored":
                    self.index.stored(event)
                elif kind == "BlockRemoved":
                    self.index.removed(event)
                elif kind == "AllBlocksCleared":
                    self.index.cleared()
        except (ValueError, TypeError, KeyError, msgpack.UnpackException) as exc:
            self._unreadable(f"batch {seq} could not be read: {type(exc).__name__}: {exc}")
            return
        self.state = "following" if self.state != "unreadable" else self.state
        self.next_seq = seq + 1
        self._digests[seq] = zlib.crc32(payload)
        if len(self._digests) > RECENT:
            self._digests.popitem(last=False)
        self.batches += 1
        self._owed_since, self._last_batch_at = None, time.monotonic()
        self._last_batch_ts = ts if isinstance(ts, (int, float)) else None

    def _unreadable(self, why: str) -> None:
        if self.state != "unreadable":
            log.error("the KV events of the vLLM server %s cannot be read (%s): routing uses what looptrace sent "
                      "it instead", self.server, why)
        self.state, self.error = "unreadable", why
        self.index.cleared()


def start(events: KVEvents) -> asyncio.Task:
    return asyncio.create_task(events.run(), name=f"kv-events {events.server}")
