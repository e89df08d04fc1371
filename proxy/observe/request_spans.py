"""One request's spans, fed by the Generation it watches (an Observer: engine/observer.py).

Span tree, one trace per request (an incoming traceparent is continued):

    chat {model} | responses {model}      server span: request, usage, finish reasons, status
    ├── render                            the exact prompt, its ids, what is new in this conversation
    ├── prefill                           submission → first token: prompt and cached tokens
    ├── decode                            the backend call (its traceparent goes upstream), token events;
    │                                     with vLLM, the server (server.address, .port), why it was chosen
    │                                     (looptrace.route.*: the receipt) and any retry
    └── execute_tool {name}               one per tool call the model made

Names: common/attributes.py (a session's agents: trace_store/agent_spans.py). Per token (`token`): one
append; the decode span's token events come in groups, built in bulk (trace_store/tokens.py's `columns`).
"""

from __future__ import annotations

import logging
import time

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.propagate import inject
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, Tracer

from looptrace.backends.base import DecodeRequest
from looptrace.backends.events import PrefillEvent, TokenEvent, UpstreamEvent
from looptrace.common import attributes as attr
from looptrace.common.jsonio import dumps
from looptrace.common.redaction import Redactor
from looptrace.common.sequences import common_prefix
from looptrace.families.deltas import ToolCallDelta, UnparsedCallDelta
from looptrace.trace_store.records import request_span
from looptrace.trace_store.tokens import GROUP
from looptrace.trace_store.tokens import columns as token_columns

from ..engine.generation import Generation
from ..engine.observer import Observer
from . import genai, openinference, route_receipt, span_records
from .conversations import Conversations, Turn
from .prompt_record import continuity_attributes, media_items, stored_prompt, template_hash
from .span_arrays import add_event, set_arrays, take_arrays
from .tool_spans import arriving_results, call_key, tool_call_span

log = logging.getLogger("looptrace")


class RequestSpans(Observer):
    def __init__(self, tracer: Tracer, conversations: Conversations, *, content: bool, endpoint: str,
                 parent: Context | None, attributes: dict, exported: bool = False,
                 redactor: Redactor | None = None) -> None:
        self.tracer = tracer
        # Credentials in what is recorded become markers (common/redaction.py); None: `--redact off`.
        self.redactor = redactor
        self._redacted = 0  # credentials replaced in this request's record
        self.conversations = conversations
        self.content = content
        # Spans go over OTLP too: each whole (the store keeps deltas) and with what Phoenix reads.
        self.exported = exported
        self.endpoint = endpoint
        self.model = ""
        self.conversation: str | None = None
        self.tenant = attributes.get(attr.TENANT)  # whose request: its tool calls are found within it alone
        self.span = tracer.start_span(
            endpoint, context=parent, kind=SpanKind.SERVER,
            attributes={attr.ENDPOINT: endpoint, attr.GEN_AI_PROVIDER_NAME: "looptrace",
                        attr.GEN_AI_OPERATION_NAME: "chat", **attributes},
        )
        # Exemplars point at traces only when the trace is kept somewhere.
        self.trace_id = format(self.span.get_span_context().trace_id, "032x") if self.span.is_recording() else None
        self._context = trace.set_span_in_context(self.span)
        self._decode_span = None
        self._submitted_ns = 0
        self._prefill: PrefillEvent | None = None  # its span is made at the end, when cached tokens are known
        self._prefill_ns = 0
        # (event, channel, arrival) of each token since the last group was recorded: what this trace
        # adds to an event beside it. Events themselves are never written to.
        self._pending: list[tuple[TokenEvent, str, int]] = []
        self._recording = False
        self._turn: Turn | None = None  # what the conversation's last request left, and what this one leaves
        self._receipt: dict | None = None  # the routing's receipt (vLLM): what it predicted
        self._ttft: float | None = None  # the backend's time to first token (its prefill event's)
        self._version_given = attr.WEIGHT_VERSION in attributes  # the client's X-Weight-Version wins over vLLM's

    # -- what the adapter knows --

    @property
    def turn(self) -> Turn:
        if self._turn is None:
            self._turn = self.conversations.begin(self.conversation)
            self._turn.trace_id = self.trace_id
        return self._turn

    def requested(self, model: str, *, stream: bool, conversation: str | None, group: str | None = None,
                  line: str | None = None) -> None:
        """`line`: the agent's conversation line (api/agents.py), whose last turn says what is new."""
        self.model, self.conversation = model, line or conversation
        self._turn = self.conversations.begin(self.conversation)  # its last turn is read while this one is prepared
        self._turn.trace_id = self.trace_id
        self.span.update_name(f"{self.endpoint} {model}")
        self.span.set_attributes({attr.GEN_AI_REQUEST_MODEL: model, attr.GEN_AI_REQUEST_STREAM: stream})
        if conversation:
            self.span.set_attribute(attr.GEN_AI_CONVERSATION_ID, conversation)
        if group:
            self.span.set_attribute(attr.ROLLOUT_GROUP, group)

    def responded(self, response_id: str) -> None:
        self.span.set_attribute(attr.GEN_AI_RESPONSE_ID, response_id)

    def grouped(self, how: str) -> None:
        self.span.set_attribute(attr.SESSION_GROUPED_BY, how)

    def asked(self, attributes: dict, texts: dict | None = None) -> None:
        """What the request asked for and nothing here acts on, as asked; `texts` (a schema) only
        where content is recorded, its credentials replaced as the prompt's are."""
        if texts and self.content:
            attributes = {**attributes, **{name: self._text(value) for name, value in texts.items()}}
        if attributes:
            self.span.set_attributes(attributes)

    def compacted(self, how: str, summary_id: str | None, replaced: int) -> None:
        self.span.set_attributes({attr.COMPACTION: how, attr.COMPACTION_REPLACED_ITEMS: replaced,
                                  **({attr.COMPACTION_ID: summary_id} if summary_id else {})})

    def expanded(self, compactions: int) -> None:
        self.span.set_attribute(attr.COMPACTION_EXPANDED, compactions)

    def forked(self, original: dict, index: int, replacement: list[int]) -> None:
        """This request runs a stored one again from its token `index`: linked to it, and saying where."""
        root = request_span(original["spans"])
        if root is not None:
            context = SpanContext(int(original["trace_id"], 16), int(root["span_id"], 16), is_remote=True,
                                  trace_flags=TraceFlags(TraceFlags.SAMPLED))
            self.span.add_link(context, {attr.LINK: "forked_from"})
        attributes = {attr.FORK_TRACE_ID: original["trace_id"], attr.FORK_INDEX: index}
        if self.content:
            attributes[attr.FORK_REPLACEMENT_IDS] = replacement
        self.span.set_attributes(attributes)

    # -- the generation --

    def rendered(self, generation: Generation, started_ns: int, ended_ns: int, content: bool = True) -> None:
        runtime, rendered, ids = generation.runtime, generation.rendered, generation.prompt_ids
        content = content and self.content
        tokenizer = runtime.tokenizer
        results, links = arriving_results(self.turn, generation.request.messages, content, self.tenant)
        # Where this prompt departs from what the conversation's model saw last (its prompt and answer, as
        # the engine remembers them), compared from where its encoding departed from that prompt: the ids
        # before it are known equal.
        previous = generation.previous
        seen, encoding, base = (previous.ids, previous.encoding, previous.label) if previous else (None, 0, None)
        known = rendered.reused_ids if seen and rendered.reused_from and rendered.reused_from == encoding else 0
        new_at = known + common_prefix(seen[known:], ids[known:]) if seen else 0
        attributes = {
            attr.FAMILY: runtime.family.name,
            attr.TEMPLATE_SHA256: template_hash(tokenizer),
            attr.TOKENIZER_SHA256: runtime.tokenizer_sha256,
            attr.PROMPT_TOKENS: len(ids),
            attr.PROMPT_NEW_OFFSET: new_at,
            attr.PROMPT_THINKING: rendered.thinking,
            attr.PROMPT_REUSED_TOKENS: rendered.reused_ids,
        }
        if rendered.checked is not None:
            attributes[attr.PROMPT_CHECKED] = rendered.checked
        attributes.update(continuity_attributes(generation.continuity))
        if rendered.merged_system:
            attributes[attr.PROMPT_MERGED_SYSTEM_MESSAGES] = rendered.merged_system
        if generation.media_parts:  # a prompt of text alone holds no media tokens: a typed one is text
            items = media_items(generation, content)
            attributes[attr.PROMPT_MEDIA] = dumps(items)
            for item in items:
                key = attr.prompt_media_tokens(item["kind"])
                attributes[key] = attributes.get(key, 0) + item["tokens"]
        if generation.forced_ids:  # the answer's forced opening, at the end of the prompt ids
            attributes[attr.PROMPT_FORCED_TOKENS] = len(generation.forced_ids)
            attributes[attr.PROMPT_FORCED_PREFIX] = generation.forced_text if content else ""
        if self.content and not content:  # read as "recorded without content" otherwise
            attributes[attr.PROMPT_NOT_KEPT] = "past_context"
        if content:
            new_text = tokenizer.decode(ids[new_at:]) if new_at else ""
            attributes.update(stored_prompt(rendered, generation.forced_text, ids, new_text, base, encoding,
                                            whole=self.exported))
        if self.exported:
            attributes.update(openinference.PROMPT)
        if content and self.redactor is not None:
            self._redact_prompt(attributes, tokenizer, results)
        if results and self.tenant is not None:  # the store joins each result to its call within the tenant
            attributes[attr.TENANT] = self.tenant
        arrays = take_arrays(attributes)
        span = self.tracer.start_span(attr.SPAN_RENDER, context=self._context, start_time=started_ns, links=links,
                                      attributes=attributes)
        set_arrays(span, arrays)
        for result in results:
            span.add_event(attr.EVENT_TOOL_RESULT, result, timestamp=ended_ns)
        span.end(end_time=ended_ns)
        if content and generation.request.messages:
            self._record_messages(generation)

    _redact_prompt = span_records.redact_prompt

    _redact_tokens = span_records.redact_tokens

    _text = span_records.text

    _record_messages = span_records.record_messages

    def submitted(self, generation: Generation, decode: DecodeRequest) -> dict[str, str]:
        """Opens the decode span; returns its traceparent, for the engine to send upstream."""
        sampling = decode.sampling
        self.span.set_attributes({
            attr.GEN_AI_REQUEST_TEMPERATURE: sampling.temperature, attr.GEN_AI_REQUEST_TOP_P: sampling.top_p,
            attr.GEN_AI_REQUEST_TOP_K: sampling.top_k, attr.GEN_AI_REQUEST_MAX_TOKENS: decode.max_tokens,
            attr.GEN_AI_REQUEST_PRESENCE_PENALTY: sampling.presence_penalty,
            attr.GEN_AI_REQUEST_FREQUENCY_PENALTY: sampling.frequency_penalty,
            **({attr.GEN_AI_REQUEST_SEED: sampling.seed} if sampling.seed is not None else {}),
        })
        self._submitted_ns = time.time_ns()
        backend = generation.runtime.backend
        attributes = {attr.BACKEND: backend.name}
        if backend.route:
            attributes[attr.BACKEND_ROUTE] = backend.route
        if self.exported:
            attributes.update(openinference.CHAIN)
        span = self._decode_span = self.tracer.start_span(attr.SPAN_DECODE, context=self._context,
                                                          start_time=self._submitted_ns, attributes=attributes)
        self._pieces = generation.runtime.vocab.pieces
        self._tokenizer = generation.runtime.tokenizer
        self._groups: list[dict] = []  # the token events' arrays, redacted in place before the span ends
        self._recording = span.is_recording()
        carrier: dict = {}
        inject(carrier, context=trace.set_span_in_context(span))
        # The traceparent alone: a client's baggage and tracestate are not sent on to the server behind.
        return {"traceparent": carrier["traceparent"]} if "traceparent" in carrier else {}

    def upstream(self, event: UpstreamEvent) -> None:
        """The vLLM server this attempt goes to; a retry says which one failed first, and how."""
        span = self._decode_span
        if span is None:
            return
        attributes = {attr.SERVER_ADDRESS: event["address"], attr.SERVER_PORT: event["port"],
                      attr.BACKEND_ROUTE: event["route"]}
        if event["moved_from"]:
            attributes[attr.UPSTREAM_MOVED_FROM] = event["moved_from"]
        receipt = event.get("receipt")
        if receipt:
            self._receipt = receipt
            attributes.update(route_receipt.chosen(receipt))
        span.set_attributes(attributes)
        retry = event["retry_after"]
        if retry:
            span.add_event(attr.EVENT_UPSTREAM_RETRY, {attr.UPSTREAM_FAILED: retry["server"],
                                                       attr.ERROR_TYPE: retry["code"],
                                                       attr.UPSTREAM_ERROR: retry["message"]})

    def prefill(self, event: PrefillEvent) -> None:
        self._prefill, self._prefill_ns, self._ttft = event, time.time_ns(), event["seconds"]

    def _end_prefill(self, cached: int | None) -> None:
        """The prefill span, from submission to the first token, once the cached tokens are known
        (a vLLM server says how many only at the end); None: never learnt (the request failed)."""
        event, self._prefill = self._prefill, None
        if event is None:
            return
        attributes = {attr.PREFILL_PROMPT_TOKENS: event["prompt_tokens"], attr.PREFILL_SECONDS: event["seconds"]}
        if event.get("upstream_prompt_tokens") is not None:  # vLLM expanded the media itself
            attributes[attr.PREFILL_UPSTREAM_PROMPT_TOKENS] = event["upstream_prompt_tokens"]
            if event["upstream_differs_at"] is not None:
                attributes[attr.PREFILL_UPSTREAM_DIFFERS_AT] = event["upstream_differs_at"]
                log.warning("the vLLM server expanded the media of request %s into another prompt than this "
                            "server's processor (%d tokens, not %d; from token %d)", self.trace_id,
                            event["upstream_prompt_tokens"], event["prompt_tokens"], event["upstream_differs_at"])
        if cached is not None:
            attributes[attr.PREFILL_CACHED_TOKENS] = cached
        if self.exported:
            attributes.update(openinference.CHAIN)
        span = self.tracer.start_span(attr.SPAN_PREFILL, context=self._context, start_time=self._submitted_ns,
                                      attributes=attributes)
        span.end(end_time=self._prefill_ns)

    def token(self, event: TokenEvent, channel: str, now_ns: int) -> None:
        # The per-token path: one append. Span events are made once per group of tokens
        # (_flush_tokens), where the work is done in bulk.
        pending = self._pending
        pending.append((event, channel, now_ns))
        if len(pending) >= GROUP:
            self._flush_tokens()

    def _flush_tokens(self) -> None:
        pending = self._pending
        if not pending:
            return
        self._pending = []
        if self._recording and self._decode_span is not None:
            events, channels, times = zip(*pending)
            group = token_columns(events, list(channels), list(times), self._pieces if self.content else None)
            if self.content and self.redactor is not None:
                self._groups.append(group)
            add_event(self._decode_span, attr.EVENT_TOKENS, group, times[0])

    def tool_call(self, delta: ToolCallDelta) -> None:
        span = tool_call_span(self.tracer, self._context, delta["outcome"],
                              self._text(delta["raw"]) if self.content else None, delta["name"], delta["id"],
                              delta["index"], self._text(delta["arguments"]) if self.content else None,
                              self.tenant)
        self.turn.expect_result(call_key(delta["id"], self.tenant), span.get_span_context(), delta["name"])

    def unparsed_call(self, delta: UnparsedCallDelta) -> None:
        tool_call_span(self.tracer, self._context, "unparsed", self._text(delta["raw"]) if self.content else None)

    def finished(self, generation: Generation) -> None:
        done = generation.done_event or {}
        reasons = [generation.finish_reason] if generation.finish_reason else []
        self.span.set_attributes({
            attr.GEN_AI_RESPONSE_MODEL: self.model,
            attr.GEN_AI_RESPONSE_FINISH_REASONS: reasons,
            attr.GEN_AI_USAGE_INPUT_TOKENS: generation.prompt_tokens,
            attr.GEN_AI_USAGE_OUTPUT_TOKENS: generation.completion_tokens,
            attr.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS: generation.reasoning_tokens,
            attr.USAGE_CACHED_TOKENS: generation.cached_tokens,
            attr.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: generation.cached_tokens,
            attr.GEN_AI_USAGE_CACHE_WRITE_INPUT_TOKENS: generation.cache_write_tokens,
            attr.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS: generation.cache_write_tokens,
        })
        if self.exported:
            self.span.set_attribute(attr.LLM_TOKEN_COUNT_COMPLETION_DETAILS_REASONING, generation.reasoning_tokens)
        if self.content:
            text = "".join(generation.text)
            answer = genai.output_message("".join(generation.reasoning), text, generation.tool_calls,
                                          generation.finish_reason)
            self.span.set_attribute(attr.GEN_AI_OUTPUT_MESSAGES, self._text(dumps([answer])))
            if self.exported:
                exported = openinference.answer(text, generation.tool_calls)
                exported[attr.OUTPUT_VALUE] = self._text(exported[attr.OUTPUT_VALUE])
                self.span.set_attributes(exported)
        self._end_prefill(generation.cached_tokens)
        method = {attr.SPEC_METHOD: done["draft_method"]} if done.get("draft_method") else {}
        if self._receipt is not None:  # the receipt's other half: what the server then said and took
            method.update(route_receipt.answered(self._receipt, generation.cached_tokens, self._ttft))
        if done.get("weight_version"):  # the weights vLLM said sampled it: the step's, unless the client said
            method[attr.UPSTREAM_WEIGHT_VERSION] = done["weight_version"]
            if not self._version_given:
                self.span.set_attributes({attr.WEIGHT_VERSION: done["weight_version"],
                                          attr.WEIGHT_VERSION_SOURCE: "vllm"})
        self._end_decode({
            **method,
            attr.GEN_AI_RESPONSE_FINISH_REASONS: reasons,
            attr.DECODE_TOKENS: generation.completion_tokens,
            attr.DECODE_SECONDS: done.get("seconds", 0.0),
            attr.DECODE_TOKENS_PER_SECOND: done.get("tokens_per_second", 0.0),
            attr.DECODE_BACKEND_FINISH_REASON: done.get("finish_reason", ""),
            attr.SPEC_DRAFTS: done.get("drafts", 0),
            attr.SPEC_DRAFTED_TOKENS: done.get("drafted", 0),
            attr.SPEC_ACCEPTED_TOKENS: done.get("accepted", 0),
        })
        # Kept before the client hears the end: its next turn, on any process, finds this one.
        self.turn.finish()

    def _end_decode(self, attributes: dict, error: str | None = None) -> None:
        span = self._decode_span
        if span is None:
            return
        self._flush_tokens()
        self._decode_span = None
        redacted = self._redact_tokens()
        if redacted:
            attributes = {**attributes, attr.REDACTED: redacted}
        span.set_attributes(attributes)
        if error:
            span.set_status(Status(StatusCode.ERROR, error))
            span.set_attribute(attr.ERROR_TYPE, error)
        span.end()

    # -- the request's end --

    def end(self, status: int, error_type: str | None) -> None:
        """The request ended with this HTTP status (499: the client left), and this error, if one."""
        prefill = self._prefill
        if prefill is not None:  # the generation never finished: cached tokens as far as they are known
            self._end_prefill(prefill["cached_tokens"])
        if error_type:
            self._end_decode({}, error_type)
            self.span.set_status(Status(StatusCode.ERROR, error_type))
            self.span.set_attribute(attr.ERROR_TYPE, error_type)
        elif self._decode_span is not None:
            self._end_decode({}, "incomplete")
        self.span.set_attribute(attr.HTTP_RESPONSE_STATUS_CODE, status)
        if self._redacted:
            self.span.set_attribute(attr.REDACTED, self._redacted)
        self.span.end()
        self.turn.end()

