"""One export batch as rows for each table, gathered in Python from the spans in the order they ended,
whichever store writes them (sqlite/write.py, postgres/write.py): a batch is turned into rows first
and then written as a few multi-row statements, so the writer gives up and wins back the GIL (or, on
PostgreSQL, makes a round trip) a few times per batch, not per span (measured before: 31,000 spans/s
alone, 107 spans/s beside a busy thread, written a statement per span).
"""

from __future__ import annotations

from opentelemetry.sdk.trace import ReadableSpan

from looptrace.common import attributes as attr
from looptrace.common.jsonio import dumps

from .chains import base_rows, compacted
from .packing import Unpackable, pack
from .records import storable
from .steps import StepGatherer, searchable_text

OUTCOME_COLUMNS = {"valid": "tools_valid", "invalid_args": "tools_invalid_args",
                   "unknown_tool": "tools_unknown_tool", "unparsed": "tools_unparsed"}

TRACE_COLUMNS = ("trace_id", "start_ns", "end_ns", "endpoint", "model", "conversation", "status", "http_status",
                 "input_tokens", "output_tokens", "session", "client", "client_version", "error", "finish_reason",
                 "fork_of", "step", "tenant")




def hex_id(value: int, width: int) -> str:
    """A trace id (width 32) or span id (16) as OTLP's JSON and the store write it."""
    return format(value, f"0{width}x")


class Batch:
    """Rows for each table, gathered from spans in the order they ended."""

    def __init__(self, steps: StepGatherer) -> None:
        self._steps = steps
        self.spans: list[tuple] = []
        self.tool_calls: list[tuple] = []
        self.results: list[tuple] = []
        self.traces: list[tuple] = []
        self.texts: list[tuple] = []
        self.sessions: list[tuple] = []
        self.bases: list[tuple] = []  # trace_bases rows (chains.py)
        self.stored: list[dict] = []  # the step summaries of the requests this batch completes

    def add(self, span: ReadableSpan) -> None:
        ctx = span.context
        trace_id, span_id = hex_id(ctx.trace_id, 32), hex_id(ctx.span_id, 16)
        attrs = compacted(dict(span.attributes) if span.attributes else {})  # as the store keeps it
        events = [{"name": e.name, "time_unix_nano": e.timestamp, "attributes": dict(e.attributes or {})}
                  for e in span.events]
        links = [{"trace_id": hex_id(link.context.trace_id, 32), "span_id": hex_id(link.context.span_id, 16),
                  "attributes": dict(link.attributes or {})} for link in span.links]
        status = span.status.status_code.name.lower()
        kept, tokens = packed_events(events)
        # Text a client may have sent (a model's name is in the span's) is made storable: a lone
        # surrogate in one request's model once failed the whole batch, everyone's spans with it.
        self.spans.append((trace_id, span_id, hex_id(span.parent.span_id, 16) if span.parent else None,
                           storable(span.name),
                           span.kind.name.lower(), span.start_time, span.end_time, status, dumps(attrs),
                           dumps(kept), dumps(links), tokens))
        self.bases += [tuple(map(_text, row)) for row in base_rows(trace_id, span_id, attrs)]
        call_id = attrs.get(attr.GEN_AI_TOOL_CALL_ID)
        tenant = attrs.get(attr.TENANT)
        if call_id and span.name.startswith(attr.SPAN_EXECUTE_TOOL):
            self.tool_calls.append((_text(call_key(call_id, tenant)), trace_id, span_id))
        for event in events:
            if event["name"] == attr.EVENT_TOOL_RESULT:
                result = event["attributes"]
                extra = {attr.TOOL_RESULT_TRACE_ID: trace_id}
                if attr.TOOL_RESULT in result:
                    extra[attr.TOOL_RESULT] = result[attr.TOOL_RESULT]
                self.results.append((_text(call_key(result.get(attr.GEN_AI_TOOL_CALL_ID), tenant)), dumps(extra)))
        if attr.ENDPOINT not in attrs:
            self._steps.add(trace_id, span.name, attrs, span.start_time, span.end_time)
            return
        step = self._steps.finish(trace_id, attrs, span.start_time, span.end_time, status)
        self._add_trace(attrs, step)
        self.stored.append(step)

    def _add_trace(self, attrs: dict, step: dict) -> None:
        trace_id, fork_of = step["trace_id"], (step.get("fork_of") or {}).get("trace_id")
        conversation = _text(attrs.get(attr.GEN_AI_CONVERSATION_ID))
        session = step["session"] = conversation or f"trace:{trace_id}"
        client, version = _text(attrs.get(attr.CLIENT_NAME)), _text(attrs.get(attr.CLIENT_VERSION))
        model = _text(step.get("model"))
        tenant = _text(attrs.get(attr.TENANT))
        if tenant is not None:
            step["tenant"] = tenant  # the live feed shows a step to its tenant alone
        self.traces.append((trace_id, step["start_ns"], step["end_ns"], _text(step.get("endpoint")), model,
                            conversation, step["status"], step.get("http_status"), step.get("input_tokens"),
                            step.get("output_tokens"), session, client, version, _text(step.get("error")),
                            _text(step.get("finish_reason")), _text(fork_of), dumps(step), tenant))
        text = searchable_text(step)
        if text:
            self.texts.append((trace_id, storable(text)))
        if fork_of:
            return  # a fork is shown with the step it continued, not as a step of the session
        tools = step["tools"]
        self.sessions.append((session, conversation, model, client, version, step["start_ns"],
                              step["start_ns"], 1, step.get("input_tokens") or 0, step.get("output_tokens") or 0,
                              *(tools.get(outcome, 0) for outcome in OUTCOME_COLUMNS),
                              int(step["status"] == "error"), trace_id, tenant))


def call_key(call_id, tenant):
    """A tool call's id as tool_calls keys it: within its tenant, so that a result another tenant sends
    with the same id never joins (and writes into) this tenant's call."""
    return call_id if tenant is None or call_id is None else f"{tenant}\x1f{call_id}"


def _text(value):
    return storable(value) if type(value) is str else value


def packed_events(events: list[dict]) -> tuple[list[dict], bytes | None]:
    """A span's events as stored: its token events' attributes packed into one blob (packing.py), the
    events left in place with none of their own; or all of them as they are, and no blob."""
    groups = [e["attributes"] for e in events if e["name"] == attr.EVENT_TOKENS]
    if not groups:
        return events, None
    try:
        blob = pack(groups)
    except Unpackable:
        return events, None
    return [{**e, "attributes": {}} if e["name"] == attr.EVENT_TOKENS else e for e in events], blob


