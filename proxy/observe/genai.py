"""The conversation as the OpenTelemetry GenAI conventions record it on a span, so that other GenAI
tools (Phoenix, Langfuse, MLflow, Weave) show a request as the messages it carried:

    gen_ai.system_instructions   the system prompt, as parts
    gen_ai.input.messages        the rest of the conversation, role and parts per message
    gen_ai.output.messages       the model's answer: reasoning, text, tool calls, with its finish reason
    gen_ai.tool.definitions      the tools offered

Parts are the conventions' `text`, `reasoning`, `tool_call` and `tool_call_response`. Written by hand
(plain dicts, once per request): the conventions' own Python models (opentelemetry-util-genai) are a
beta library with instrumentation dependencies; the tests check this output against them.
"""

from __future__ import annotations

from looptrace.common.jsonio import dumps, loads_strict

# Our finish reasons → the conventions' (`tool_call`, singular; the rest are the same words).
FINISH_REASONS = {"tool_calls": "tool_call"}


def _arguments(value: object) -> object:
    """A call's arguments as an object where they are strict JSON, else as the text the model or client
    wrote (NaN or 1e400 read into a float would be written back out as what no strict reader takes)."""
    if isinstance(value, str):
        try:
            return loads_strict(value)
        except ValueError:
            return value
    as_written = getattr(value, "text", None)  # api/validation.py's ArgumentsAsWritten
    return as_written if isinstance(as_written, str) else value


def text_of(content: object) -> str:
    if isinstance(content, list):  # parts: their text; an attached item is a part of its own (_parts)
        return "\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return content if isinstance(content, str) else "" if content is None else dumps(content)


def _parts(content: object) -> list[dict]:
    """A message's content as the conventions' parts: text, and each attached item as a `uri` part
    naming it by its digest (its bytes stay out of the span; the render span describes it)."""
    if not isinstance(content, list):
        return [{"type": "text", "content": text_of(content)}] if content else []
    parts = []
    for p in content:
        media = p.get("media") if isinstance(p, dict) else None
        if media is not None and hasattr(media, "info"):
            parts.append({"type": "uri", "modality": media.kind, "mime_type": media.mime or None,
                          "uri": "sha256:" + media.info.get("sha256", "")})
        elif isinstance(p, dict) and isinstance(p.get("text"), str):
            parts.append({"type": "text", "content": p["text"]})
    return parts


def message(source: dict) -> dict:
    """One message in Hugging Face's common format (the engine's) → role and parts."""
    role = source.get("role", "user")
    parts: list[dict] = []
    if role == "tool":
        parts.append({"type": "tool_call_response", "id": source.get("tool_call_id") or None,
                      "response": text_of(source.get("content"))})
    else:
        if source.get("reasoning_content"):
            parts.append({"type": "reasoning", "content": source["reasoning_content"]})
        if source.get("content"):
            parts.extend(_parts(source["content"]))
        for call in source.get("tool_calls") or ():
            function = call.get("function", {})
            parts.append({"type": "tool_call", "id": call.get("id"), "name": function.get("name", ""),
                          "arguments": _arguments(function.get("arguments"))})
    out = {"role": role, "parts": parts}
    if source.get("name") and role != "tool":
        out["name"] = source["name"]
    return out


def system_instructions(messages: list[dict]) -> tuple[list[dict], int]:
    """The leading system messages as system instructions (text parts), and how many they were: the
    input messages are the ones after them."""
    lead = 0
    while lead < len(messages) and messages[lead].get("role") == "system":
        lead += 1
    return [{"type": "text", "content": text_of(m.get("content"))} for m in messages[:lead]], lead


def output_message(reasoning: str, text: str, tool_calls: list[dict], finish_reason: str | None) -> dict:
    """The answer as one assistant message; `tool_calls` are the parser's tool_call deltas."""
    parts: list[dict] = []
    if reasoning:
        parts.append({"type": "reasoning", "content": reasoning})
    if text:
        parts.append({"type": "text", "content": text})
    for call in tool_calls:
        parts.append({"type": "tool_call", "id": call["id"], "name": call["name"],
                      "arguments": _arguments(call["arguments"])})
    reason = finish_reason or "error"
    return {"role": "assistant", "parts": parts, "finish_reason": FINISH_REASONS.get(reason, reason)}


def tool_definitions(tools: list[dict] | None) -> list[dict]:
    out = []
    for tool in tools or ():
        function = tool.get("function", {})
        out.append({"type": "function", "name": function.get("name", ""), "description": function.get("description"),
                    "parameters": function.get("parameters")})
    return out
