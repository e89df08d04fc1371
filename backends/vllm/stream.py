"""One request's stream from a vLLM server: sending it on the route the server offers, reading the
server-sent events, and turning vLLM's chunks into the events every backend yields.

Every wait on the server is bounded (the upstream's timeouts); every failure is a BackendError the
client hears, with the server's own words where it gave any.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import AsyncIterator

import aiohttp
import orjson

from looptrace.common import jsonio
from looptrace.common.vocabulary import Vocabulary

from ..base import BackendError, DecodeRequest
from ..events import Event, done_event, prefill_event, token_event
from . import protocol
from .upstream import Upstream, describe


# What a router in front of the servers keeps one conversation on one server by (vllm-router's
# consistent_hash reads it, as llm-d's gateway and vLLM itself do), and the request's own id.
SESSION_HEADER = "X-Session-ID"
REQUEST_ID_HEADER = "X-Request-Id"


async def post(up: Upstream, request: DecodeRequest, max_tokens: int) -> tuple[aiohttp.ClientResponse, str]:
    """The request sent, on the route the server offers: its streaming response and the route it came
    by, or the server's refusal as a BackendError. A request the generate route refuses (403, 404, 405: a server behind a
    router without it) goes again by /v1/completions, which every vLLM has."""
    generate_route = up.route == protocol.GENERATE
    build = protocol.generate_body if generate_route else protocol.completions_body
    data = json.dumps(build(up.model, request, max_tokens)).encode()
    headers = {**up.headers, "Content-Type": "application/json", **routing_headers(request)}
    headers.update(request.trace_headers)  # our decode span's traceparent: vLLM's own span becomes its child
    try:
        # sock_read bounds each wait for data, whichever task drives the stream (the Responses adapter
        # reads its first event in a task of its own), and stops counting while the consumer is slow.
        response = await up.send(up.route, data, headers, up.stream_timeout)
    except aiohttp.ClientConnectionError as exc:
        if isinstance(exc, aiohttp.SocketTimeoutError):
            raise  # it answered the connection, then nothing: a timeout
        up.unreachable(f"cannot reach the vLLM server at {up.url}: {describe(exc)}")
        raise BackendError(up.error, status=502, code="upstream_unreachable") from exc
    up.answered()
    if response.status != 200:
        error = await _refusal(up, response)
        response.release()
        if generate_route and response.status in (403, 404, 405):
            up.generate_refused(response.status, error.message)
            return await post(up, request, max_tokens)
        raise error
    return response, up.route if not generate_route else protocol.GENERATE


def routing_headers(request: DecodeRequest) -> dict[str, str]:
    """The conversation as a router's session key — a digest: the id is the client's (or its tenant's,
    `tenant/…`), and neither is the business of a server's logs — and the request's id, our decode
    span's (from its traceparent), so a router's and a server's logs name the request the trace does."""
    headers = {}
    if request.conversation:
        digest = hashlib.sha256(request.conversation.encode("utf-8", "surrogatepass")).hexdigest()[:32]
        headers[SESSION_HEADER] = digest
    parent = request.trace_headers.get("traceparent", "")
    fields = parent.split("-")
    if len(fields) == 4:
        headers[REQUEST_ID_HEADER] = f"{fields[1]}-{fields[2]}"
    return headers


def read_chunk(payload: bytes) -> dict:
    """One of vLLM's chunks: read by orjson at once. Its numbers are token ids, ranks, counts and logprobs, far from
    64 bits, so the scan for long integers that jsonio.loads makes of a client's JSON first (a regular expression
    over every digit of every logprob: most of the time of reading a chunk) finds nothing here; what orjson
    refuses (a logprob of -Infinity or NaN, as Python's json writes them) is read by jsonio."""
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        return jsonio.loads(payload)


class SSEReader:
    """A server-sent-event stream's `data:` payloads, as JSON, until `[DONE]` (then `ended`)."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response
        self.ended = False

    async def __aiter__(self) -> AsyncIterator[dict]:
        buffer = b""
        async for block in self.response.content.iter_any():
            lines = (buffer + block).split(b"\n")
            buffer = lines.pop()
            for line in lines:
                if not line.startswith(b"data:"):
                    continue  # the blank line between events, comments
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    self.ended = True
                    return
                yield read_chunk(payload)

    def close(self) -> None:
        if self.ended:
            self.response.release()
        else:
            self.response.close()  # closing the connection is how vLLM learns to stop generating


class TokenEmitter:
    """vLLM's chunks → prefill, token and done events: each token detokenized here (as every backend
    does), its logprob and top five as the server sent them, the finish reason and the server's counts
    (cached prompt tokens, speculative drafts) from the last chunks."""

    def __init__(self, vocab: Vocabulary, request: DecodeRequest, max_tokens: int, up: Upstream) -> None:
        self.vocab, self.request, self.max_tokens, self.url = vocab, request, max_tokens, up.url
        self.parse = protocol.generate_tokens if up.route == protocol.GENERATE else protocol.completions_tokens
        self.detokenizer = vocab.detokenizer(request.prompt_ids[-4:])
        self.prefilled, self.count, self.finish, self.reason = False, 0, "", None
        self.output_ids: list[int] = []  # what the server generated: in its prefix cache now, with the prompt
        self.cached, self.upstream_prompt, self.spec = 0, None, None
        self.weight_version: str | None = None  # what the server said sampled the answer (its final chunk)
        self.started = self.first_at = time.perf_counter()

    def sent_by(self, route: str) -> None:
        """The route the request went by (post: one the generate route refused goes by completions)."""
        self.parse = protocol.generate_tokens if route == protocol.GENERATE else protocol.completions_tokens

    def read(self, chunk: dict) -> list[Event]:
        self.upstream_prompt = chunk.get("prompt_token_ids") or self.upstream_prompt  # asked for with media
        events: list[Event] = []
        choices = chunk.get("choices")
        if choices:
            choice = choices[0]
            self.reason = choice.get("finish_reason")
            self.weight_version = protocol.weight_versions(choice.get("weight_versions")) or self.weight_version
            self._tokens(self.parse(choice), events)
            if self.finish != "cancelled" and self.reason is not None and self.reason not in ("stop", "length"):
                raise BackendError(f"the vLLM server at {self.url} ended the generation with finish_reason "
                                   f"'{self.reason}' after {_tokens(self.count)}", status=502,
                                   code="upstream_finish_reason")
        elif "error" in chunk:  # a failure during generation: vLLM's error frame
            raise _upstream_error(self.url, chunk, self.count)
        usage = chunk.get("usage")
        if usage:
            self.cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        self.spec = protocol.speculative_counts(chunk.get("metrics")) or self.spec
        return events

    def _tokens(self, tokens: list, events: list[Event]) -> None:
        request, vocab, detokenizer = self.request, self.vocab, self.detokenizer
        pieces, special, stop_ids = vocab.pieces, vocab.special, request.stop_ids
        last = len(tokens) - 1
        for k, (token_id, logprob, rank, top_ids, top_logprobs) in enumerate(tokens):
            if not self.prefilled:
                self.first_at = time.perf_counter()
                self.prefilled = True
                events.append(prefill_event(len(request.prompt_ids), None, self.first_at - self.started,
                                            upstream_prompt=self.upstream_prompt, rendered=request.prompt_ids))
            self.count += 1
            self.output_ids.append(token_id)
            if token_id in stop_ids:
                text, self.finish = "", "stop"
            else:
                text = detokenizer.step(token_id)
                if request.cancel.is_set():
                    self.finish = "cancelled"
                if self.finish or self.count >= self.max_tokens or (k == last and self.reason is not None):
                    text += detokenizer.flush()  # the last token: bytes held back come out now
            events.append(token_event(self.count - 1, token_id, pieces[token_id] if 0 <= token_id < len(pieces) else "",
                                      text, token_id in special, logprob, rank, top_ids, top_logprobs))
            if self.finish == "cancelled":
                return

    def done(self, ended: bool, weight_version: str | None = None) -> Event:
        """`weight_version`: the server's current one (its /weight_info), for a response that says none."""
        finish = self.finish
        if finish != "cancelled":
            if not ended or self.reason is None:
                raise cut(self.url, self.count, "the stream ended without [DONE]" if not ended else "no finish_reason")
            finish = self.reason
        drafts, drafted, accepted = self.spec or (0, 0, 0)
        return done_event(finish, self.count, time.perf_counter() - self.first_at, cached_tokens=self.cached,
                          drafts=drafts, drafted=drafted, accepted=accepted,
                          weight_version=self.weight_version or weight_version)


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
    code = (chunk.get("error") or {}).get("code") if isinstance(chunk.get("error"), dict) else None
    if count == 0 and isinstance(code, int) and 400 <= code < 500:
        # vLLM's engine checks a request after the 200 (a prompt past the context on the generate route, an id
        # out of the vocabulary): the same refusal as an HTTP 4xx, so the client hears it as its own error.
        return BackendError(message, status=code, code="upstream_rejected")
    return BackendError(f"the vLLM server at {url} failed after {_tokens(count)}: {message}", status=502,
                        code="upstream_error")


def cut(url: str, count: int, why: str) -> BackendError:
    return BackendError(f"the vLLM server at {url} cut the stream after {_tokens(count)}: {why}", status=502,
                        code="upstream_stream_cut")


def _tokens(n: int) -> str:
    return f"{n} token" if n == 1 else f"{n} tokens"
