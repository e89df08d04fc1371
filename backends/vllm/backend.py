"""The vLLM backend: the prompt is rendered and tokenized here, token ids go to a vLLM server, and
the tokens coming back are turned into the same events as local decoding.

Its promise: the token ids, their text (decoded here, with the same detokenizer as every backend),
the finish reason, the logprob and top five of each token are the server's, relayed unchanged.
What it does not promise: the server's sampling equal to ours (only greedy output is comparable),
or a rank for every token (`/v1/completions` reports none; a token outside the top five then has
rank None). vLLM reports cached prompt tokens only at the end of a stream: the `prefill` event
says None, and `done` carries the number.

Two routes: `/inference/v1/generate` (token ids in and out, ranks) when the server has it, probed
at load (upstream.py), else `/v1/completions` with a token-id prompt. Failures become a
`BackendError` the client hears, never a hang: every wait on the server is bounded by the timeout.

Several servers may serve the model (pool.py chooses one per request, by the routing policy of
routing/policies.py, and says why in the `upstream` event). A server that fails before the first token
(refused, cut, an error, silence past the timeout) is left for another, once: nothing has reached the
client yet. After the first token a failure is the client's error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import aiohttp

from looptrace.common.vocabulary import Vocabulary

from ..base import BackendError, DecodeRequest, Loader, LoaderHost, TextModel, TokenScore
from ..events import Event, upstream_event
from .pool import Pool
from .routing import Price, PromptBlocks
from .scoring import score_on
from .spawn import SpawnedVLLM, default_command
from .stream import SSEReader, TokenEmitter, cut, post
from .upstream import Upstream, describe

__all__ = ["Pool", "Upstream", "VLLMBackend", "VLLMLoader"]

log = logging.getLogger("looptrace")


class VLLMLoader(Loader):
    """MODEL is what the servers serve (any of them names it when none is given); the checkpoint's
    tokenizer and template are read where --tokenizer says, else where the server read them; the
    context is the servers' (--max-model-len may only lower it). Without --vllm-url, looptrace starts
    the server itself (spawn.py) and forwards to it."""

    def __init__(self, settings, host: LoaderHost) -> None:
        super().__init__(settings, host)
        urls, endpoints = settings.vllm_urls, settings.vllm_kv_events
        self.spawned = None
        if not urls:
            self.spawned = SpawnedVLLM(settings.vllm_command or default_command(), settings.model,
                                       start_timeout=settings.vllm_start_timeout)
            urls = [self.spawned.url]
            endpoints = [self.spawned.kv_events] if self.spawned.kv_events else []
        upstreams = [Upstream(url, settings.vllm_api_key, settings.vllm_timeout) for url in urls]
        self.pool = Pool(upstreams, settings.routing)
        if endpoints:
            _follow_kv_events(upstreams, endpoints)
        elif settings.routing == "cache-aware":
            log.info("routing by what each vLLM server was sent (an estimate): no --vllm-kv-events to read what "
                     "they hold")

    async def connect(self) -> str:
        """Waits for the first server to answer, saying meanwhile why none has."""
        if self.spawned is not None:
            await self.spawned.start(self.host.waiting)
        first = await self.pool.reach(self.settings.model, self.host.waiting)
        self.host.waiting(None)
        return first.model

    def checkpoint_source(self) -> str:
        return self.settings.tokenizer or self.pool.reference.checkpoint_source()

    def context(self, asked: int | None, checkpoint: int) -> int:
        limit = self.pool.reference.max_model_len
        return min(asked or limit, limit)

    def load(self, model: TextModel) -> VLLMBackend:
        return VLLMBackend(self.pool, model.vocab, self.spawned)

    def health_details(self) -> dict:
        return _health(self.pool, self.spawned)

    async def close(self) -> None:
        await self.pool.close()
        if self.spawned is not None:
            await self.spawned.stop()


def _follow_kv_events(upstreams: list[Upstream], endpoints: list[str]) -> None:
    """Each server's KV events (`ENDPOINT[,REPLAY_ENDPOINT]`, or "none"), read into what it holds."""
    from .routing.kv_events import KVEvents  # ZeroMQ and msgpack: the vllm extra, checked with the options

    for upstream, spec in zip(upstreams, endpoints):
        if spec != "none":
            endpoint, _, replay = spec.partition(",")
            upstream.holdings.events = KVEvents(upstream.name, endpoint, replay or None)


def _health(pool: Pool, spawned: SpawnedVLLM | None) -> dict:
    """Where tokens come from, by which route, whether each server answers; the one looptrace started."""
    details = {"upstreams": pool.health()}
    if spawned is not None:
        details["spawned"] = spawned.health()
    return details


class VLLMBackend:
    name = "vllm"
    route = None  # each server's own: the `upstream` event says which was used
    expands_media = True  # vLLM's own processor expands each item's placeholder
    waiting = 0  # vLLM queues; nothing waits here

    def __init__(self, pool: Pool, vocab: Vocabulary, spawned: SpawnedVLLM | None = None) -> None:
        self.pool = pool  # the backend's from here on: closed with it
        self.vocab = vocab
        self.spawned = spawned  # the server looptrace started, if it did: stopped with it

    @property
    def running(self) -> int:
        return self.pool.running

    @property
    def serving(self) -> bool:
        return self.pool.serving

    @property
    def upstreams(self) -> list[Upstream]:
        return self.pool.upstreams

    @property
    def media_refusal(self) -> str:
        return self.pool.media_refusal()

    def health_details(self) -> dict:
        return _health(self.pool, self.spawned)

    async def generate(self, request: DecodeRequest) -> AsyncIterator[Event]:
        prompt = PromptBlocks(request.prompt_ids, request.cache_salt)
        await self.pool.settled()
        route = self.pool.choose(request.conversation, prompt)
        failed = None  # the attempt before this one, when it failed before its first token
        while True:
            up = route.upstream
            yield upstream_event(up.name, up.address, up.port, up.route, moved_from=route.moved_from,
                                 retry_after=failed, receipt=route.receipt())
            first = True
            try:
                async for event in self._stream(up, request, route.chosen.price, prompt):
                    first = False
                    yield event
                return
            except BackendError as exc:
                # Retried once elsewhere when nothing reached the client and the server, not the request,
                # is at fault (a 4xx would be refused by any server alike).
                if failed is not None or not first or exc.status < 500 or request.cancel.is_set():
                    raise
                failed = {"server": up.name, "code": exc.code, "message": exc.message}
                try:
                    route = self.pool.choose(request.conversation, prompt, failed=up)
                except BackendError:
                    raise exc from None  # no other server: the client hears what went wrong
                route.moved_from = failed["server"]  # the conversation moves from the server that failed
                # %r: the server's message may quote what the client sent; a log line stays one line.
                log.warning("the vLLM server at %s failed before the first token (%r); trying %s", route.moved_from,
                            exc.message, route.upstream.name)

    async def score(self, prompt_ids: list[int], answer_ids: list[int],
                    cache_salt: str | None = None) -> list[TokenScore]:
        """Teacher-forced scoring by the server's prompt_logprobs (scoring.py), on any server."""
        route = self.pool.choose(None)
        return await score_on(route.upstream, prompt_ids, answer_ids, cache_salt)

    async def _stream(self, up: Upstream, request: DecodeRequest, price: Price,
                      prompt: PromptBlocks) -> AsyncIterator[Event]:
        room = up.max_model_len - len(request.prompt_ids)
        if room <= 0:
            raise BackendError(f"This model's maximum context length is {up.max_model_len} tokens, and the prompt "
                               f"already has {len(request.prompt_ids)}.", status=400, code="context_length_exceeded")
        tokens = TokenEmitter(self.vocab, request, min(request.max_tokens, room), up)
        reader: SSEReader | None = None
        sent = time.monotonic()
        up.running += 1
        ticket = up.cost.sent(price)  # ahead of the requests routed after it, until its first token
        coming = up.holdings.sending(prompt)  # its blocks, held for the requests queued behind it
        try:
            response, route = await post(up, request, tokens.max_tokens)
            tokens.sent_by(route)
            reader = SSEReader(response)
            async for chunk in reader:
                events = tokens.read(chunk)
                if tokens.prefilled and not ticket.answered:
                    up.cost.first_token(ticket)
                for event in events:
                    yield event
                if tokens.finish == "cancelled":
                    break
        except TimeoutError as exc:
            where = f"after token {tokens.count}" if tokens.prefilled else "before the first token"
            raise BackendError(f"the vLLM server at {up.url} sent nothing for {up.timeout:g} s {where} "
                               f"(--vllm-timeout)", status=504, code="upstream_timeout") from exc
        except aiohttp.ClientError as exc:  # the connection broke mid-stream
            raise cut(up.url, tokens.count, describe(exc)) from exc
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:  # a chunk we cannot read
            log.warning("the vLLM server at %s sent a chunk that could not be read: %r", up.url, exc)
            raise BackendError(f"the vLLM server at {up.url} sent a chunk looptrace cannot read (not the shape of a "
                               "vLLM completion chunk; the server's log has the fault)", status=502,
                               code="upstream_protocol") from exc
        finally:
            up.running -= 1
            up.cost.closed(ticket)
            up.holdings.ended(coming)
            if reader is not None:
                reader.close()
        done = tokens.done(reader.ended, up.weight_version)
        if done["finish_reason"] != "cancelled":  # what the server now holds: the estimate's, and events owed
            up.holdings.served(request.prompt_ids, tokens.output_ids, tokens.cached, sent, media=bool(request.media),
                               salt=request.cache_salt)
            if tokens.prefilled:  # what its wait teaches the server's price (vLLM counts cached tokens at the end)
                up.cost.learn(ticket, len(tokens.upstream_prompt or request.prompt_ids) - tokens.cached,
                              tokens.first_at - tokens.started)
                # The fits it changes, made once this turn of the loop is done: not before the next request's first token.
                asyncio.get_running_loop().call_soon(up.cost.refit)
        yield done

    async def close(self) -> None:
        await self.pool.close()
        if self.spawned is not None:
            await self.spawned.stop()
