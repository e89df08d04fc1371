"""The execute_tool span of one tool call the model made, as the server traces it and as `looptrace
replay` traces a replayed step's calls: built here alone, so both read the same; and the results of
calls traced earlier, as a later request brings them."""

from __future__ import annotations

from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, Tracer

from looptrace.common import attributes as attr

from looptrace.trace_store.batch import call_key

from .conversations import Turn
from .genai import text_of


def tool_call_span(tracer: Tracer, context: Context, outcome: str, raw: str | None, name: str | None = None,
                   call_id: str | None = None, index: int | None = None, arguments: str | None = None,
                   tenant: str | None = None) -> Span:
    """An ended `execute_tool {name}` span (`execute_tool` alone for a call that did not parse: no
    name); `raw` and `arguments` None where content is not recorded; `tenant`: whose call it is."""
    attributes = {attr.GEN_AI_OPERATION_NAME: "execute_tool", attr.TOOL_OUTCOME: outcome}
    if tenant is not None:
        attributes[attr.TENANT] = tenant
    if name is not None:
        attributes.update({attr.GEN_AI_TOOL_NAME: name, attr.GEN_AI_TOOL_CALL_ID: call_id,
                           attr.GEN_AI_TOOL_TYPE: "function", attr.TOOL_INDEX: index})
        if arguments is not None:
            attributes[attr.GEN_AI_TOOL_CALL_ARGUMENTS] = arguments
    if raw is not None:
        attributes[attr.TOOL_RAW] = raw
    span_name = f"{attr.SPAN_EXECUTE_TOOL} {name}" if name is not None else attr.SPAN_EXECUTE_TOOL
    span = tracer.start_span(span_name, context=context, kind=SpanKind.INTERNAL, attributes=attributes)
    span.end()
    return span


def arriving_results(turn: Turn, messages: list[dict], content: bool,
                     tenant: str | None = None) -> tuple[list[dict], list[Link]]:
    """Results of calls traced earlier, arriving now: the render span's `looptrace.tool_result` events
    (the result's text where content is recorded) and its links to each call's span. A call is found
    within its tenant alone: another's result with the same id is not joined to it."""
    results, links = [], []
    answered = [m for m in messages if m.get("role") == "tool"]
    waiting = turn.take_results([call_key(m.get("tool_call_id"), tenant) for m in answered]) if answered else {}
    for message in answered:
        pending = waiting.get(call_key(message.get("tool_call_id"), tenant))
        if pending is None:
            continue
        context, name = pending
        result = {attr.GEN_AI_TOOL_CALL_ID: message["tool_call_id"], attr.GEN_AI_TOOL_NAME: name}
        if content:
            result[attr.TOOL_RESULT] = text_of(message.get("content"))  # parts: their text
        results.append(result)
        links.append(Link(context, {attr.GEN_AI_TOOL_CALL_ID: message["tool_call_id"]}))
    return results, links
