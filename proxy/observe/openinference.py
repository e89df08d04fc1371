"""What Arize Phoenix reads beside the GenAI conventions' attributes (OpenInference's names), set only
on spans exported over OTLP: the trace store leaves them out (trace_store/chains.py's `compacted`).

Phoenix turns the gen_ai.* attributes into its own names itself (model, messages, tool calls and
definitions, token counts, session) and keeps any name a span already carries. What it cannot derive,
and shows otherwise as "--", UNKNOWN or the answer's id: the short input and output of a request that
its trace list and session view show, the reasoning tokens under its name, and a kind for the spans
that are not a model call.
"""

from __future__ import annotations

from looptrace.common import attributes as attr

from .genai import text_of

PROMPT = {attr.OPENINFERENCE_SPAN_KIND: "PROMPT"}  # render: the chat template applied
CHAIN = {attr.OPENINFERENCE_SPAN_KIND: "CHAIN"}  # prefill, decode: steps of the model call
TEXT = "text/plain"


def turn_input(messages: list[dict]) -> dict:
    """What this turn brought: the messages after the model's last answer (a question, the tools'
    results), as text. Read from the end, so a turn costs what it adds, not the conversation's length."""
    start = len(messages)
    while start and messages[start - 1].get("role") != "assistant":
        start -= 1
    brought = messages[start:] or messages[-1:]
    text = "\n\n".join(("tool: " if m.get("role") == "tool" else "") + text_of(m.get("content")) for m in brought)
    return {attr.INPUT_VALUE: text, attr.INPUT_MIME_TYPE: TEXT}


def answer(text: str, tool_calls: list[dict]) -> dict:
    """The answer as text: what the model said, then each call it made as name(arguments)."""
    lines = [text] if text else []
    lines += [f"{call['name']}({call['arguments']})" for call in tool_calls]
    return {attr.OUTPUT_VALUE: "\n".join(lines), attr.OUTPUT_MIME_TYPE: TEXT}
