"""One request's trace and metrics, fed by the Generation it watches.

Span tree, one trace per request (an incoming traceparent is continued):

    chat {model} | responses {model}      server span: request, usage, finish reasons, status
    ├── render                            the exact prompt, its ids, what is new in this conversation
    ├── prefill                           submission → first token: prompt and cached tokens
    ├── decode                            the backend call (its traceparent goes upstream), token events;
    │                                     with vLLM, the server (server.address, .port) and any retry
    └── execute_tool {name}               one per tool call the model made

The per-token path (`token`) appends to lists and touches two metric children; spans get their
token events in groups (trace_store/tokens.py).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import logging
import time
from collections import Counter
from math import exp
from types import MappingProxyType

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.propagate import inject
from opentelemetry.sdk.trace import Event
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, Tracer

from looptrace.backends.base import DecodeRequest
from looptrace.common.sequences import common_prefix
from looptrace.backends.events import TOP_N, PrefillEvent, TokenEvent, UpstreamEvent
from looptrace.common.jsonio import dumps
from looptrace.trace_store import tokens as token_events
from looptrace.trace_store.schema import RESULT_EVENT, ROOT_MARK, request_span

from ..engine.generation import Generation, Observer
from . import genai
from .conversations import Conversations
from .metrics import Metrics, observe_all

log = logging.getLogger("looptrace")


class RequestTrace(Observer):
    def __init__(self, tracer: Tracer, metrics: Metrics, conversations: Conversations, *, content: bool,
                 endpoint: str, parent: Context | None, attributes: dict) -> None:
        self.tracer = tracer
        self.metrics = metrics
        self.conversations = conversations
        self.content = content
        self.endpoint = endpoint
        self.model = ""
        self._label = "unknown"  # the `model` label of this request's metrics: the served model, once checked
        self.conversation: str | None = None
        self.status = 200
        self.error_type: str | None = None
        self.started = time.perf_counter()
        self.span = tracer.start_span(
            endpoint, context=parent, kind=SpanKind.SERVER,
            attributes={ROOT_MARK: endpoint, "gen_ai.provider.name": "looptrace", "gen_ai.operation.name": "chat",
                        **attributes},
        )
        # Exemplars point at traces only when the trace is kept somewhere.
        self.trace_id = format(self.span.get_span_context().trace_id, "032x") if self.span.is_recording() else None
        self._exemplar = {"trace_id": self.trace_id} if self.trace_id else None
        self._context = trace.set_span_in_context(self.span)
        self._decode_span = None
        self._submitted_ns = 0
        self._prefill: PrefillEvent | None = None  # its span is made at the end, when cached tokens are known
        self._prefill_ns = 0
        self._last_token: float | None = None
        self._max_itl = 0.0
        # Token events since the last group was recorded, with what this trace adds to each: the
        # channel, the wall-clock time, the gap before it. Events themselves are never written to.
        self._pending: list[TokenEvent] = []
        self._channels: list[str] = []
        self._times: list[int] = []
        self._gaps: list[float] = []
        self._recording = False
        self._output_ids: list[int] = []
        self._server: str | None = None  # the vLLM server the tokens come from, once the backend says

    # -- what the adapter knows --

    def requested(self, model: str, *, stream: bool, conversation: str | None) -> None:
        self.model = model
        self.conversation = conversation
        self.span.update_name(f"{self.endpoint} {model}")
        self.span.set_attributes({"gen_ai.request.model": model, "gen_ai.request.stream": stream})
        if conversation:
            self.span.set_attribute("gen_ai.conversation.id", conversation)

    def checked(self) -> None:
        """The model asked for is the one served: from here on it labels this request's metrics.
        Until then it is "unknown", so that no string a client sends becomes a label value."""
        self._label = self.model

    def responded(self, response_id: str) -> None:
        self.span.set_attribute("gen_ai.response.id", response_id)

    def forked(self, original: dict, index: int, replacement: list[int]) -> None:
        """This request runs a stored one again from its token `index`: linked to it, and saying where."""
        root = request_span(original["spans"])
        if root is not None:
            context = SpanContext(int(original["trace_id"], 16), int(root["span_id"], 16), is_remote=True,
                                  trace_flags=TraceFlags(TraceFlags.SAMPLED))
            self.span.add_link(context, {"looptrace.link": "forked_from"})
        attributes = {"looptrace.fork.trace_id": original["trace_id"], "looptrace.fork.index": index}
        if self.content:
            attributes["looptrace.fork.replacement_ids"] = replacement
        self.span.set_attributes(attributes)

    # -- the generation --

    def rendered(self, generation: Generation, started_ns: int, ended_ns: int, content: bool = True) -> None:
        runtime, rendered, ids = generation.runtime, generation.rendered, generation.prompt_ids
        content = content and self.content
        family, tokenizer = runtime.family, runtime.tokenizer
        results, links = self._tool_results(generation.request.messages, content)
        seen = self.conversations.seen(self.conversation) if self.conversation else None
        new_at = common_prefix(seen, ids) if seen else 0
        attributes = {
            "looptrace.family": family.name,
            "looptrace.template.sha256": _template_hash(tokenizer),
            "looptrace.prompt.tokens": len(ids),
            "looptrace.prompt.new_offset": new_at,
            "looptrace.prompt.thinking": rendered.thinking,
        }
        if rendered.merged_system:
            attributes["looptrace.prompt.merged_system_messages"] = rendered.merged_system
        if generation.media_parts:  # a prompt of text alone holds no media tokens: a typed one is text
            items = _media_items(generation, content)
            attributes["looptrace.prompt.media"] = dumps(items)
            for item in items:
                key = f"looptrace.prompt.media.{item['kind']}_tokens"
                attributes[key] = attributes.get(key, 0) + item["tokens"]
                self.metrics.media_items.labels(self._label, item["kind"]).inc()
                self.metrics.media_tokens.labels(self._label, item["kind"]).inc(item["tokens"])
        if generation.forced_ids:  # the answer's forced opening, at the end of the prompt ids
            attributes["looptrace.prompt.forced_tokens"] = len(generation.forced_ids)
            attributes["looptrace.prompt.forced_prefix"] = generation.forced_text if content else ""
        if self.content and not content:  # read as "recorded without content" otherwise
            attributes["looptrace.prompt.not_kept"] = "past_context"
        if content:
            attributes["looptrace.prompt.text"] = rendered.text + generation.forced_text
            attributes["looptrace.prompt.ids"] = ids
            attributes["looptrace.prompt.new_text"] = tokenizer.decode(ids[new_at:]) if new_at else ""
        span = self.tracer.start_span("render", context=self._context, start_time=started_ns, links=links,
                                      attributes=attributes)
        for result in results:
            span.add_event(RESULT_EVENT, result, timestamp=ended_ns)
        span.end(end_time=ended_ns)
        if content and generation.request.messages:
            self._record_messages(generation)

    def _record_messages(self, generation: Generation) -> None:
        """The conversation in the GenAI conventions' shape (genai.py), and which messages are new
        since the conversation's last request: what a person reads as this step of the loop. Each
        message is encoded once; its JSON is also its digest for finding what is new."""
        request = generation.request
        messages = [dumps(genai.message(m)) for m in request.messages]
        instructions, lead = genai.system_instructions(request.messages)
        new_from = self.conversations.new_messages_from(self.conversation, [hash(m) for m in messages]) \
            if self.conversation else 0
        attributes = {
            "gen_ai.input.messages": "[" + ",".join(messages[lead:]) + "]",
            "looptrace.input.new_from": new_from,
            "looptrace.input.new_messages": "[" + ",".join(messages[new_from:]) + "]",
        }
        if instructions:
            attributes["gen_ai.system_instructions"] = dumps(instructions)
        if request.tools:
            attributes["gen_ai.tool.definitions"] = dumps(genai.tool_definitions(request.tools))
        self.span.set_attributes(attributes)

    def submitted(self, generation: Generation, decode: DecodeRequest) -> None:
        sampling = decode.sampling
        self.span.set_attributes({
            "gen_ai.request.temperature": sampling.temperature, "gen_ai.request.top_p": sampling.top_p,
            "gen_ai.request.top_k": sampling.top_k, "gen_ai.request.max_tokens": decode.max_tokens,
            "gen_ai.request.presence_penalty": sampling.presence_penalty,
            "gen_ai.request.frequency_penalty": sampling.frequency_penalty,
            **({"gen_ai.request.seed": sampling.seed} if sampling.seed is not None else {}),
        })
        self._submitted_ns = time.time_ns()
        backend = generation.runtime.backend
        attributes = {"looptrace.backend": backend.name}
        if backend.route:
            attributes["looptrace.backend.route"] = backend.route
        self._decode_span = self.tracer.start_span("decode", context=self._context, start_time=self._submitted_ns,
                                                   attributes=attributes)
        carrier: dict = {}
        inject(carrier, context=trace.set_span_in_context(self._decode_span))
        decode.traceparent = carrier.get("traceparent")
        self._pieces = generation.runtime.vocab.pieces
        self._recording = self._decode_span.is_recording()
        self._itl = self.metrics.itl.labels(self.model)

    def upstream(self, event: UpstreamEvent) -> None:
        """The vLLM server this attempt goes to; a retry says which one failed first, and how."""
        server = self._server = event["server"]
        metrics = self.metrics
        metrics.upstream_requests.labels(self.model, server).inc()
        attributes = {"server.address": event["address"], "server.port": event["port"],
                      "looptrace.backend.route": event["route"]}
        if event["moved_from"]:
            attributes["looptrace.upstream.moved_from"] = event["moved_from"]
            metrics.upstream_moved.labels(self.model, event["moved_from"]).inc()
        retry = event["retry_after"]
        if retry:
            metrics.upstream_errors.labels(self.model, retry["server"], retry["code"]).inc()
        span = self._decode_span
        if span is not None:
            span.set_attributes(attributes)
            if retry:
                span.add_event("looptrace.upstream.retry", {"looptrace.upstream.failed": retry["server"],
                                                            "error.type": retry["code"],
                                                            "looptrace.upstream.error": retry["message"]})

    def prefill(self, event: PrefillEvent) -> None:
        self._prefill, self._prefill_ns = event, time.time_ns()
        self.metrics.prompt_tokens.labels(self.model).inc(event["prompt_tokens"])

    def _end_prefill(self, cached: int | None) -> None:
        """The prefill span, from submission to the first token, once the cached tokens are known
        (a vLLM server says how many only at the end); None: never learnt (the request failed)."""
        event, self._prefill = self._prefill, None
        if event is None:
            return
        attributes = {"looptrace.prefill.prompt_tokens": event["prompt_tokens"],
                      "looptrace.prefill.seconds": event["seconds"]}
        if event.get("upstream_prompt_tokens") is not None:  # vLLM expanded the media itself
            attributes["looptrace.prefill.upstream_prompt_tokens"] = event["upstream_prompt_tokens"]
            if event["upstream_differs_at"] is not None:
                attributes["looptrace.prefill.upstream_differs_at"] = event["upstream_differs_at"]
                log.warning("the vLLM server expanded the media of request %s into another prompt than this "
                            "server's processor (%d tokens, not %d; from token %d)", self.trace_id,
                            event["upstream_prompt_tokens"], event["prompt_tokens"], event["upstream_differs_at"])
        if cached is not None:
            attributes["looptrace.prefill.cached_tokens"] = cached
            if cached:
                self.metrics.cached_tokens.labels(self.model).inc(cached)
        span = self.tracer.start_span("prefill", context=self._context, start_time=self._submitted_ns,
                                      attributes=attributes)
        span.end(end_time=self._prefill_ns)

    def token(self, event: TokenEvent, channel: str) -> None:
        # The per-token path: a clock read and a few appends. Metrics and span events are made once per
        # group of tokens (_flush_tokens), where the work is done in bulk.
        now = time.perf_counter()
        last, self._last_token = self._last_token, now
        if last is None:
            self.metrics.ttft.labels(self.model, self.endpoint).observe(now - self.started, self._exemplar)
            if self._server is not None:
                self.metrics.upstream_ttft.labels(self.model, self._server).observe(now - self.started, self._exemplar)
        else:
            self._gaps.append(now - last)
        self._times.append(time.time_ns())
        self._channels.append(channel)
        pending = self._pending
        pending.append(event)
        if len(pending) >= token_events.GROUP:
            self._flush_tokens()

    def _flush_tokens(self) -> None:
        events, channels, times, gaps = self._pending, self._channels, self._times, self._gaps
        if not events:
            return
        self._pending, self._channels, self._times, self._gaps = [], [], [], []
        itl = self._itl
        slowest = max(gaps, default=0.0)
        if slowest > self._max_itl:  # an exemplar on each new slowest gap points slow buckets at this trace
            self._max_itl = slowest
            gaps.remove(slowest)
            itl.observe(slowest, self._exemplar)
        observe_all(itl, gaps)
        for channel, count in Counter(channels).items():
            self.metrics.generation_tokens.labels(self.model, channel).inc(count)
        if self._server is not None:
            self.metrics.upstream_tokens.labels(self.model, self._server).inc(len(events))
        self._output_ids.extend(e["id"] for e in events)
        if self._recording and self._decode_span is not None:
            _add_event(self._decode_span, token_events.EVENT, self._token_attributes(events, channels, times),
                       times[0])

    def _token_attributes(self, events: list[TokenEvent], channels: list[str], times: list[int]) -> dict:
        """One group's parallel arrays; the top five of each token padded to TOP_N entries."""
        columns = {
            "index": [e["index"] for e in events],
            "time_unix_nano": times,
            "special": [e["special"] for e in events],
            "channel": channels,
            "p": [e["p"] for e in events],
            "logprob": [e["logprob"] for e in events],
            "rank": [e["rank"] for e in events],
            "top_p": [p for e in events for p in _padded([exp(lp) for lp in e["top_logprobs"]], -1.0)],
            "drafted": [e.get("drafted", 0) for e in events],
            "accepted": [e.get("accepted", 0) for e in events],
        }
        if self.content:
            pieces = self._pieces
            columns["id"] = [e["id"] for e in events]
            columns["piece"] = [e["piece"] for e in events]
            columns["text"] = [e["text"] for e in events]
            columns["top_ids"] = [i for e in events for i in _padded(e["top_ids"], -1)]
            columns["top_pieces"] = [pieces[i] if 0 <= i < len(pieces) else "" for i in columns["top_ids"]]
        return {token_events.PREFIX + name: values for name, values in columns.items()}

    def tool_call(self, delta: dict) -> None:
        unparsed = delta["type"] == "tool_call_unparsed"
        outcome = "unparsed" if unparsed else delta["outcome"]
        self.metrics.tool_calls.labels(self.model, outcome).inc()
        attributes = {"gen_ai.operation.name": "execute_tool", "looptrace.tool.outcome": outcome}
        if not unparsed:
            attributes.update({"gen_ai.tool.name": delta["name"], "gen_ai.tool.call.id": delta["id"],
                               "gen_ai.tool.type": "function", "looptrace.tool.index": delta["index"]})
            if self.content:
                attributes["gen_ai.tool.call.arguments"] = delta["arguments"]
        if self.content:
            attributes["looptrace.tool.raw"] = delta["raw"]
        name = "execute_tool" if unparsed else f"execute_tool {delta['name']}"
        span = self.tracer.start_span(name, context=self._context, kind=SpanKind.INTERNAL, attributes=attributes)
        span.end()
        if not unparsed:
            self.conversations.expect_result(delta["id"], span.get_span_context(), delta["name"])

    def finished(self, generation: Generation) -> None:
        done = generation.done_event or {}
        reasons = [generation.finish_reason] if generation.finish_reason else []
        self.span.set_attributes({
            "gen_ai.response.model": self.model,
            "gen_ai.response.finish_reasons": reasons,
            "gen_ai.usage.input_tokens": generation.prompt_tokens,
            "gen_ai.usage.output_tokens": generation.completion_tokens,
            "gen_ai.usage.reasoning.output_tokens": generation.reasoning_tokens,
            "looptrace.usage.cached_tokens": generation.cached_tokens,
            "gen_ai.usage.cache_read.input_tokens": generation.cached_tokens,
            "gen_ai.usage.cache_creation.input_tokens": generation.cache_write_tokens,
        })
        if self.content:
            answer = genai.output_message("".join(generation.reasoning), "".join(generation.text),
                                          generation.tool_calls, generation.finish_reason)
            self.span.set_attribute("gen_ai.output.messages", dumps([answer]))
        self._end_prefill(generation.cached_tokens)
        rate = done.get("tokens_per_second", 0.0)
        if rate:
            self.metrics.decode_rate.labels(self.model).observe(rate, self._exemplar)
        if done.get("drafted"):
            self.metrics.spec_draft_tokens.labels(self.model).inc(done["drafted"])
            self.metrics.spec_accepted_tokens.labels(self.model).inc(done["accepted"])
            self.metrics.spec_drafts.labels(self.model).inc(done["drafts"])
        self._end_decode({
            "gen_ai.response.finish_reasons": reasons,
            "looptrace.decode.tokens": generation.completion_tokens,
            "looptrace.decode.seconds": done.get("seconds", 0.0),
            "looptrace.decode.tokens_per_second": rate,
            "looptrace.decode.backend_finish_reason": done.get("finish_reason", ""),
            "looptrace.spec.drafts": done.get("drafts", 0),
            "looptrace.spec.drafted_tokens": done.get("drafted", 0),
            "looptrace.spec.accepted_tokens": done.get("accepted", 0),
        })
        if self.conversation:
            self._flush_tokens()
            self.conversations.saw(self.conversation, generation.prompt_ids + self._output_ids)

    def _end_decode(self, attributes: dict, error: str | None = None) -> None:
        span = self._decode_span
        if span is None:
            return
        self._flush_tokens()
        self._decode_span = None
        span.set_attributes(attributes)
        if error:
            span.set_status(Status(StatusCode.ERROR, error))
            span.set_attribute("error.type", error)
        span.end()

    # -- the request's end --

    def fail(self, status: int, error_type: str) -> None:
        """The request ended in an error: its HTTP status (499: the client left) and what it was."""
        self.status, self.error_type = status, error_type

    def stream_failed(self, code: str) -> None:
        """An error after the status line went out: the status stays, the span says what broke."""
        self.error_type = code

    def end(self) -> None:
        prefill = self._prefill
        if prefill is not None:  # the generation never finished: cached tokens as far as they are known
            self._end_prefill(prefill["cached_tokens"])
        if self.error_type:
            if self._server is not None and self.error_type.startswith("upstream_"):  # the server's failure
                self.metrics.upstream_errors.labels(self.model, self._server, self.error_type).inc()
            self._end_decode({}, self.error_type)
            self.span.set_status(Status(StatusCode.ERROR, self.error_type))
            self.span.set_attribute("error.type", self.error_type)
        elif self._decode_span is not None:
            self._end_decode({}, "incomplete")
        self.span.set_attribute("http.response.status_code", self.status)
        self.span.end()
        seconds = time.perf_counter() - self.started
        model = self._label
        self.metrics.requests.labels(model, self.endpoint, str(self.status)).inc()
        self.metrics.duration.labels(model, self.endpoint).observe(seconds, self._exemplar)

    # -- helpers --

    def _tool_results(self, messages: list[dict], content: bool) -> tuple[list[dict], list[Link]]:
        """Results of calls traced earlier, arriving now: recorded here and linked to their call's span."""
        results, links = [], []
        for message in messages:
            if message.get("role") != "tool":
                continue
            pending = self.conversations.take_result(message.get("tool_call_id"))
            if pending is None:
                continue
            context, name = pending
            result = {"gen_ai.tool.call.id": message["tool_call_id"], "gen_ai.tool.name": name}
            if content:
                text = message.get("content")
                result["looptrace.tool.result"] = text if isinstance(text, str) else str(text)
            results.append(result)
            links.append(Link(context, {"gen_ai.tool.call.id": message["tool_call_id"]}))
        return results, links


def _padded(values: list, fill) -> list:
    return values if len(values) == TOP_N else list(values) + [fill] * (TOP_N - len(values))


def _add_event(span, name: str, attributes: dict, timestamp: int) -> None:
    """Deliberately past the SDK's public add_event, which checks every element of every array again
    (35 µs a token here): these arrays are built above, of plain ints, floats, bools and strings."""
    add = getattr(span, "_add_event", None)
    if add is None:
        span.add_event(name, attributes, timestamp)
    else:
        add(Event(name, MappingProxyType(attributes), timestamp))


def _template_hash(tokenizer) -> str:
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):
        template = "".join(template.get(k, "") for k in sorted(template))
    return _sha256(template)


@functools.lru_cache(maxsize=8)
def _sha256(text: str) -> str:
    # Once per template, not per request: a str keeps its own hash, so the lookup costs nothing.
    return hashlib.sha256(text.encode()).hexdigest()


def _media_items(generation: Generation, content: bool) -> list[dict]:
    """Each attached item as the trace keeps it: what it was, and where the media tokens it became
    start and how many they are (a video's are spread over its frames, between timestamps)."""
    runs = generation.media_runs
    items = []
    for n, part in enumerate(generation.media_parts):
        info = dict(part.info)
        thumbnail = info.pop("thumbnail", None)
        offset, span, length = runs[n] if n < len(runs) else (None, 0, 0)
        item = {"kind": part.kind, "mime": part.mime, "param": part.param, **info, "tokens": length, "offset": offset}
        if span != length:
            item["span"] = span
        if part.url:
            item["url"] = part.url
        if content and thumbnail:
            item["thumbnail"] = "data:image/jpeg;base64," + base64.b64encode(thumbnail).decode()
        items.append(item)
    return items
