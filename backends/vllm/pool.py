"""The vLLM servers behind the vllm backend, all serving one model: which one takes a request.

The choice is the routing policy's (--routing; routing/policies.py: rendezvous, least-loaded, cache-aware),
among the servers that answer; each choice comes with its receipt (a Route). What each server holds in
its prefix cache is kept per server (routing/kv_index.py: its KV events when it publishes them, routing/kv_events.py,
else what looptrace sent it); its load is looptrace's own count and, for the policies that weigh load, what
its /metrics says, read every second.

Each server has a task of its own: until it connects it is retried (1, 2, then every 5 s); then its
/health is probed every 5 s, and a request that cannot reach it takes it out at once. The first
server to connect sets the model; one that serves another model or context is kept out and says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from ..base import BackendError
from . import protocol, routing
from .routing import Conversations, PromptBlocks, SharedPrefixes
from .upstream import Unreachable, Upstream

log = logging.getLogger("looptrace")

RETRY_SECONDS = (1, 2, 5)  # between attempts to connect to a server; the last repeats
PROBE_SECONDS = 5.0  # between /health probes of a connected server
EVENTS_SECONDS = 5.0  # at start, the longest wait for the servers' KV events to say what they hold


class Pool:
    def __init__(self, upstreams: list[Upstream], policy: str = "rendezvous") -> None:
        if not upstreams:
            raise ValueError("a pool needs at least one vLLM server")
        if policy not in routing.POLICIES:
            raise ValueError(f"no routing policy {policy!r}; there are {', '.join(routing.POLICIES)}")
        self.upstreams = upstreams
        self.policy = policy
        for upstream in upstreams:  # one model on every server: one that has answered nothing is priced as its peers
            upstream.cost.peers = [u.cost for u in upstreams if u is not upstream]
        self.reference: Upstream | None = None  # the first to connect: its model is the model
        self._connected = asyncio.Event()
        self._fatal: Exception | None = None  # why loading cannot go on (the one server serves something unusable)
        self._tasks: list[asyncio.Task] = []
        self._conversations = Conversations()  # where each conversation's last request went, and lately
        self._shared = SharedPrefixes()  # the blocks conversations share (cache-aware weighs the rest)
        self._turn = 0  # where ties for least loaded start, so idle servers take turns

    # -- keeping the servers' state --

    async def reach(self, model: str | None, on_wait: Callable[[str], None]) -> Upstream:
        """Start watching every server; return the first to connect (`on_wait` hears why none has yet)."""
        self._tasks = [asyncio.create_task(self._keep(u, model, on_wait)) for u in self.upstreams]
        self._tasks += [asyncio.create_task(u.holdings.events.run()) for u in self.upstreams
                        if u.holdings.events is not None]
        await self._connected.wait()
        if self._fatal is not None:
            raise self._fatal
        # The first requests routed by what the servers hold already, where their events say it in time.
        following = [u.holdings.events.started.wait() for u in self.upstreams if u.holdings.events is not None]
        if following:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*following), EVENTS_SECONDS)
        return self.reference

    async def _keep(self, upstream: Upstream, model: str | None, on_wait: Callable[[str], None]) -> None:
        attempt = 0
        while True:
            if upstream.connected:
                await asyncio.sleep(PROBE_SECONDS)
                await upstream.probe()
                continue
            try:
                await upstream.connect(self.reference.model if self.reference else model)
                self._check(upstream)
                if upstream.connected:
                    self._tasks.append(asyncio.create_task(self._watch_load(upstream)))
                continue
            except Unreachable as exc:
                message = f"{exc}; retrying every {RETRY_SECONDS[-1]} s"
            except Exception as exc:  # noqa: BLE001 - it answered, but not as a server of this model
                message = str(exc)
                if self.reference is None and len(self.upstreams) == 1:
                    self._fatal = exc  # the one server serves something unusable: loading fails and says why
                    self._connected.set()
                    return
            upstream.unreachable(message)
            if attempt == 0:
                log.warning("%s", message)
            if self.reference is None:
                on_wait(message)
            await asyncio.sleep(RETRY_SECONDS[min(attempt, len(RETRY_SECONDS) - 1)])
            attempt += 1

    def _check(self, upstream: Upstream) -> None:
        """The first server to connect sets the model; the others must serve the same."""
        first = self.reference
        if first is None:
            self.reference = upstream
            self._connected.set()
            return
        if (upstream.model, upstream.root, upstream.max_model_len) != (first.model, first.root, first.max_model_len):
            upstream.connected = False
            raise RuntimeError(
                f"the vLLM server at {upstream.url} serves {upstream.model} from {upstream.root} with a context of "
                f"{upstream.max_model_len}, not what {first.url} serves ({first.model} from {first.root}, "
                f"{first.max_model_len}): every --vllm-url must serve the same model")
        log.info("vLLM at %s joins the pool", upstream.url)

    async def _watch_load(self, upstream: Upstream) -> None:
        """The server's /metrics: its block size and capacity (for the estimate of what it holds) once, and
        its requests running and waiting every LOAD_SECONDS for the policies that weigh load."""
        while upstream.connected:
            with contextlib.suppress(Unreachable):
                await upstream.read_metrics(self.policy in routing.USES_LOAD)
            if self.policy not in routing.USES_LOAD:
                return
            await asyncio.sleep(routing.LOAD_SECONDS)

    # -- choosing --

    def choose(self, conversation: str | None, prompt: list[int] | PromptBlocks | None = None,
               failed: Upstream | None = None) -> routing.Route:
        """The route of a request: its server, why, and the server its conversation's last request went to
        when that was another (the conversation moved). `failed`: the server that failed this request already."""
        live = [u for u in self.upstreams if u.serving and u is not failed]
        if not live:
            # None answers, as far as the probes know; a probe may be seconds old, so try one anyway:
            # its failure is the error the client hears.
            live = [u for u in self.upstreams if u.connected and u is not failed]
        if not live:
            raise BackendError(f"no other vLLM server to try: {failed.error if failed else 'none connected'}",
                               status=503, code="upstream_unreachable")
        if conversation is None:  # idle servers take turns
            self._turn = (self._turn + 1) % len(live)
            live = live[self._turn:] + live[:self._turn]
        if isinstance(prompt, list):
            prompt = PromptBlocks(prompt)
        shared, kept, last = 0, None, None
        if self.policy == "cache-aware" and conversation is not None:
            if prompt is not None:
                shared = self._shared.shared_tokens(conversation, prompt, live[0].holdings.block_size)
            kept, last = self._conversations.kept(), self._conversations.last(conversation)
        route = routing.choose(self.policy, live, conversation, prompt, retry=failed is not None, shared=shared,
                               kept=kept, last=last)
        if conversation is not None:
            route.moved_from = self._conversations.sent(conversation, route.upstream.name)
        return route

    async def settled(self) -> None:
        """Every server's KV-event batches that have arrived, read (kv_events.KVEvents.settled)."""
        waits = [u.holdings.events.settled() for u in self.upstreams if u.holdings.events is not None]
        if waits:
            await asyncio.gather(*waits)

    # -- what it says --

    @property
    def serving(self) -> bool:
        return any(u.serving for u in self.upstreams)

    @property
    def running(self) -> int:
        return sum(u.running for u in self.upstreams)

    def media_refusal(self) -> str:
        """Only vLLM's generate route takes items beside token ids (`content_parts`)."""
        lacking = [u.url for u in self.upstreams if u.connected and u.route != protocol.GENERATE]
        if not lacking:
            return ""
        return (f"The vLLM server at {', '.join(lacking)} does not offer {protocol.GENERATE}, the route that takes "
                "media beside token ids: start it with --enable-scale-out to send it images, audio or video.")

    def health(self) -> list[dict]:
        return [u.health() for u in self.upstreams]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for upstream in self.upstreams:
            await upstream.close()
