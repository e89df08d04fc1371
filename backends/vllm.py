"""The vLLM backend: the prompt is rendered and tokenized here, token ids go to a vLLM server, and
the tokens coming back are turned into the same events as local decoding.

Its promise: the token ids, their text (decoded here, with the same detokenizer as every backend),
the finish reason, the logprob and top five of each token are the server's, relayed unchanged.
What it does not promise: the server's sampling equal to ours (only greedy output is comparable),
or a rank for every token (`/v1/completions` reports none; a token outside the top five then has
rank None). vLLM reports cached prompt tokens only at the end of a stream: the `prefill` event
says None, and `done` carries the number.

Two routes: `/inference/v1/generate` (token ids in and out, ranks) when the server has it, probed
at load (vllm_upstream.py), else `/v1/completions` with a token-id prompt. Failures become a
`BackendError` the client hears, never a hang: every wait on the server is bounded by the timeout.

Several servers may serve the model (vllm_pool.py chooses one per request). A server that fails
before the first token (refused, cut, an error, silence past the timeout) is left for another,
once: nothing has reached the client yet. After the first token a failure is the client's error.
"""

from __future__ import annotations

import json
import logging
import time
from typing import AsyncIterator

import aiohttp

from looptrace.common import jsonio
from . import vllm_protocol as protocol
from .base import BackendError, DecodeRequest, Loader, LoaderHost, TextModel
from looptrace.common.vocabulary import Vocabulary
from .events import Event, done_event, prefill_event, token_event, upstream_event
from .vllm_pool import Pool
from .vllm_upstream import Upstream, describe

__all__ = ["Pool", "Upstream", "VLLMBackend", "VLLMLoader"]

log = logging.getLogger("looptrace")


class VLLMLoader(Loader):
    """MODEL is what the servers serve (any of them names it when none is given); the checkpoint's
    tokenizer and template are read where --tokenizer says, else where the server read them; the
    context is the servers' (--max-model-len may only lower it)."""

    def __init__(self, settings, host: LoaderHost) -> None:
        super().__init__(settings, host)
        self.pool = Pool([Upstream(url, settings.vllm_api_key, settings.vllm_timeout) for url in settings.vllm_urls])

    async def connect(self) -> str:
        """Waits for the first server to answer, saying meanwhile why none has."""
        first = await self.pool.reach(self.settings.model, self.host.waiting)
        self.host.waiting(None)
        return first.model

    def checkpoint_source(self) -> str:
        return self.settings.tokenizer or self.pool.reference.checkpoint_source()

    def context(self, asked: int | None, checkpoint: int) -> int:
        limit = self.pool.reference.max_model_len
        return min(asked or limit, limit)

    def load(self, model: TextModel) -> VLLMBackend:
        return VLLMBackend(self.pool, model.vocab)

    def health_details(self) -> dict:
        return {"upstreams": self.pool.health()}

    async def close(self) -> None:
        await self.pool.close()


class VLLMBackend:
    name = "vllm"
    route = None  # each server's own: the `upstream` event says which was used
    expands_media = True  # vLLM's own processor expands each item's placeholder
    waiting = 0  # vLLM queues; nothing waits here

    def __init__(self, pool: Pool, vocab: Vocabulary) -> None:
        self.pool = pool  # the backend's from here on: closed with it
        self.vocab = vocab

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
        return {"upstreams": self.pool.health()}  # where tokens come from, by which route, whether each answers

    async def generate(self, request: DecodeRequest) -> AsyncIterator[Event]:
        up, moved_from = self.pool.choose(request.conversation)
        failed = None  # the attempt before this one, when it failed before its first token
        while True:
            yield upstream_event(up.name, up.address, up.port, up.route, moved_from=moved_from, retry_after=failed)
            first = True
            try:
                async for event in self._stream(up, request):
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
                    up, _ = self.pool.choose(request.conversation, failed=up)
                except BackendError:
                    raise exc from None  # no other server: the client hears what went wrong
                moved_from = failed["server"]  # the conversation moves from the server that failed
                # %r: the server's message may quote what the client sent; a log line stays one line.
                log.warning("the vLLM server at %s failed before the first token (%r); trying %s", moved_from,
                            exc.message, up.name)

    async def _stream(self, up: Upstream, request: DecodeRequest) -> AsyncIterator[Event]:
        room = up.max_model_len - len(request.prompt_ids)
        if room <= 0:
            raise BackendError(f"This model's maximum context length is {up.max_model_len} tokens, and the prompt "
                               f"already has {len(request.prompt_ids)}.", status=400, code="context_length_exceeded")
        max_tokens = min(request.max_tokens, room)
        generate_route = up.route == protocol.GENERATE
        build = protocol.generate_body if generate_route else protocol.completions_body
        parse = protocol.generate_tokens if generate_route else protocol.completions_tokens
        data = json.dumps(build(up.model, request, max_tokens)).encode()
        headers = {**up.headers, "Content-Type": "application/json"}
        headers.update(request.trace_headers)  # our decode span's traceparent: vLLM's own span becomes its child

        vocab, stop_ids, cancel, timeout = self.vocab, request.stop_ids, request.cancel, up.timeout
        pieces, special = vocab.pieces, vocab.special
        detokenizer = vocab.detokenizer(request.prompt_ids[-4:])
        prefilled, cached, upstream_prompt = False, 0, None
        spec: tuple[int, int, int] | None = None
        count, finish, reason, ended = 0, "", None, False
        response = None
        started = first_at = time.perf_counter()
        up.running += 1
        try:
            try:
                # sock_read bounds each wait for data, whichever task drives this generator (the Responses
                # adapter reads its first event in a task of its own), and stops counting while the consumer
                # is slow to read.
                response = await up.session.post(up.url + up.route, data=data, headers=headers,
                                                 timeout=up.stream_timeout)
            except aiohttp.ClientConnectionError as exc:
                if isinstance(exc, aiohttp.SocketTimeoutError):
                    raise  # it answered the connection, then nothing: a timeout, below
                up.unreachable(f"cannot reach the vLLM server at {up.url}: {describe(exc)}")
                raise BackendError(up.error, status=502, code="upstream_unreachable") from exc
            up.answered()
            if response.status != 200:
                raise await _refusal(up, response)
            buffer = b""
            async for block in response.content.iter_any():
                lines = (buffer + block).split(b"\n")
                buffer = lines.pop()
                for line in lines:
                    if not line.startswith(b"data:"):
                        continue  # the blank line between events, comments
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        ended = True
                        break
                    chunk = jsonio.loads(payload)
                    upstream_prompt = chunk.get("prompt_token_ids") or upstream_prompt  # asked for with media
                    choices = chunk.get("choices")
                    if choices:
                        choice = choices[0]
                        reason = choice.get("finish_reason")
                        tokens = parse(choice)
                        last = len(tokens) - 1
                        for k, (token_id, logprob, rank, top_ids, top_logprobs) in enumerate(tokens):
                            if not prefilled:
                                first_at = time.perf_counter()
                                prefilled = True
                                yield prefill_event(len(request.prompt_ids), None, first_at - started,
                                                    upstream_prompt=upstream_prompt, rendered=request.prompt_ids)
                            count += 1
                            if token_id in stop_ids:
                                text, finish = "", "stop"
                            else:
                                text = detokenizer.step(token_id)
                                if cancel.is_set():
                                    finish = "cancelled"
                                if finish or count >= max_tokens or (k == last and reason is not None):
                                    text += detokenizer.flush()  # the last token: bytes held back come out now
                            yield token_event(count - 1, token_id,
                                              pieces[token_id] if 0 <= token_id < len(pieces) else "", text,
                                              token_id in special, logprob, rank, top_ids, top_logprobs)
                            if finish == "cancelled":
                                break
                        if finish == "cancelled":
                            break
                        if reason is not None and reason not in ("stop", "length"):
                            raise BackendError(f"the vLLM server at {up.url} ended the generation with "
                                               f"finish_reason '{reason}' after {_tokens(count)}",
                                               status=502, code="upstream_finish_reason")
                    elif "error" in chunk:  # a failure during generation: vLLM's error frame
                        raise _upstream_error(up.url, chunk, count)
                    usage = chunk.get("usage")
                    if usage:
                        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
                    spec = protocol.speculative_counts(chunk.get("metrics")) or spec
                if ended or finish == "cancelled":
                    break
        except TimeoutError as exc:
            where = f"after token {count}" if prefilled else "before the first token"
            raise BackendError(f"the vLLM server at {up.url} sent nothing for {timeout:g} s {where} "
                               f"(--vllm-timeout)", status=504, code="upstream_timeout") from exc
        except aiohttp.ClientError as exc:  # the connection broke mid-stream
            raise _cut(up.url, count, describe(exc)) from exc
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:  # a chunk we cannot read
            raise BackendError(f"the vLLM server at {up.url} sent a chunk looptrace cannot read: "
                               f"{type(exc).__name__}: {exc}", status=502, code="upstream_protocol") from exc
        finally:
            up.running -= 1
            if response is not None and not ended:
                response.close()  # closing the connection is how vLLM learns to stop generating
            elif response is not None:
                response.release()

        if finish != "cancelled":
            if not ended or reason is None:
                raise _cut(up.url, count, "the stream ended without [DONE]" if not ended else "no finish_reason")
            finish = reason
        drafts, drafted, accepted = spec or (0, 0, 0)
        yield done_event(finish, count, time.perf_counter() - first_at, cached_tokens=cached, drafts=drafts,
                         drafted=drafted, accepted=accepted)

    async def close(self) -> None:
        await self.pool.close()


async def _refusal(up: Upstream, response: aiohttp.ClientResponse) -> BackendError:
    text = await response.text()
    try:
        body = json.loads(text)
    except json.JSONDecodeError:
        body = None
    message = protocol.error_message(body, text.strip() or response.reason or "")
    status = response.status
    if status in (401, 403):  # looptrace's key or setup, not the client's fault: don't tell it its key is wrong
        return BackendError(f"the vLLM server at {up.url} refused looptrace ({status}): {message}",
                            status=502, code="upstream_refused")
    if status < 500:
        return BackendError(message, status=status, code="upstream_rejected")  # its own words, e.g. the context
    return BackendError(f"the vLLM server at {up.url} failed ({status}): {message}",
                        status=503 if status == 503 else 502, code="upstream_error")


def _upstream_error(url: str, chunk: dict, count: int) -> BackendError:
    message = protocol.error_message(chunk, json.dumps(chunk))
    return BackendError(f"the vLLM server at {url} failed after {_tokens(count)}: {message}", status=502,
                        code="upstream_error")


def _cut(url: str, count: int, why: str) -> BackendError:
    return BackendError(f"the vLLM server at {url} cut the stream after {_tokens(count)}: {why}", status=502,
                        code="upstream_stream_cut")


def _tokens(n: int) -> str:
    return f"{n} token" if n == 1 else f"{n} tokens"
