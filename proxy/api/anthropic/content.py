"""Anthropic's `system` and `messages` → the engine's messages (Hugging Face's common format).

A user message's blocks are text, image (base64 or URL) and tool_result; each tool_result becomes a
`tool` message where it stands, so text around it stays in order. An assistant message's blocks are
text, thinking, redacted_thinking and tool_use: its thinking becomes `reasoning_content`, which the
family renders as it renders earlier reasoning, and its signature is taken and ignored. A `system`
message inside `messages` (Claude Code sends one) stays a system message; the family decides where
its template can have it.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field as default

from looptrace.families.media.parts import MediaPart

from ..errors import invalid
from ..request_parts import at_most, joined, media_note
from ..validation import field

ROLES = ("user", "assistant", "system")
# Claude Code's first system block: its billing metadata (version and a hash that changes between
# sessions), not words for the model. Dropped, as vLLM drops it: it would also defeat prefix caching.
BILLING_HEADER = "x-anthropic-billing-header:"


@dataclass(slots=True)
class Conversation:
    messages: list[dict] = default(default_factory=list)
    # Deferred tools (`defer_loading`) a tool_reference block loaded: they join the tools offered.
    referenced: set[str] = default(default_factory=set)


def conversation(body: dict) -> Conversation:
    out = Conversation()
    system = _system(body.get("system"), "system")
    if system is not None:
        out.messages.append({"role": "system", "content": system})
    messages = field(body, "messages", list, "messages", required=True)
    if not messages:
        raise invalid("'messages' must hold at least one message.", param="messages", code="empty_array")
    # Bounded before any is read, as the other APIs' are (the engine bounds every kind of item again).
    for i, message in enumerate(at_most(messages, "messages", "messages")):
        _message(message, f"messages[{i}]", out)
    return out


def _system(system: object, where: str) -> str | None:
    """A system prompt as a string or text blocks → its text (None when there is none)."""
    if system is None:
        return None
    if isinstance(system, str):
        return system
    if not isinstance(system, list):
        raise invalid(f"Invalid type for '{where}': expected a string or an array of text blocks.", param=where,
                      code="invalid_type")
    texts = []
    for j, block in enumerate(system):
        param = f"{where}[{j}]"
        if _kind(block, param) != "text":
            raise invalid(f"Invalid value for '{param}.type': a system prompt holds text blocks only.",
                          param=f"{param}.type")
        text = field(block, "text", str, f"{param}.text", required=True)
        if not (j == 0 and text.startswith(BILLING_HEADER)):
            texts.append(text)
    return joined(texts)


def _kind(block: object, param: str) -> str:
    if not isinstance(block, dict):
        raise invalid(f"Invalid type for '{param}': expected an object.", param=param, code="invalid_type")
    return field(block, "type", str, f"{param}.type", required=True)


def _message(message: object, where: str, out: Conversation) -> None:
    if not isinstance(message, dict):
        raise invalid(f"Invalid type for '{where}': expected an object.", param=where, code="invalid_type")
    role = field(message, "role", str, f"{where}.role", required=True)
    if role not in ROLES:
        raise invalid(f"Invalid value for '{where}.role': {role!r}; expected 'user' or 'assistant'.",
                      param=f"{where}.role")
    content = message.get("content")
    if content is None:
        raise invalid(f"Missing required parameter: '{where}.content'.", param=f"{where}.content",
                      code="missing_required_parameter")
    if role == "system":
        out.messages.append({"role": "system", "content": _system(content, f"{where}.content")})
    elif isinstance(content, str):
        out.messages.append({"role": role, "content": content})
    elif not isinstance(content, list):
        raise invalid(f"Invalid type for '{where}.content': expected a string or an array of content blocks.",
                      param=f"{where}.content", code="invalid_type")
    elif role == "user":
        _user(at_most(content, "content parts", f"{where}.content"), f"{where}.content", out)
    else:
        out.messages.append(_assistant(at_most(content, "content parts", f"{where}.content"), f"{where}.content"))


def _user(blocks: list, where: str, out: Conversation) -> None:
    parts: list = []
    for j, block in enumerate(blocks):
        param = f"{where}[{j}]"
        kind = _kind(block, param)
        if kind == "tool_result":
            if parts:  # what the user wrote before it stays before it
                out.messages.append({"role": "user", "content": joined(parts)})
                parts = []
            out.messages.append(_tool_result(block, param, out))
        else:
            parts.append(_part(block, kind, param, "user"))
    if parts or not blocks:
        out.messages.append({"role": "user", "content": joined(parts)})


def _tool_result(block: dict, param: str, out: Conversation) -> dict:
    call_id = field(block, "tool_use_id", str, f"{param}.tool_use_id", required=True)
    # Accepted and not rendered: templates have no place for it, and Claude Code writes the error
    # into the result's text as well.
    field(block, "is_error", bool, f"{param}.is_error")
    content = block.get("content")
    if content is None or isinstance(content, str):
        return {"role": "tool", "tool_call_id": call_id, "content": content or ""}
    if not isinstance(content, list):
        raise invalid(f"Invalid type for '{param}.content': expected a string or an array of content blocks.",
                      param=f"{param}.content", code="invalid_type")
    parts = []
    for k, item in enumerate(content):
        where = f"{param}.content[{k}]"
        kind = _kind(item, where)
        if kind == "tool_reference":  # Claude Code's tool search: the named deferred tool is loaded
            name = field(item, "tool_name", str, f"{where}.tool_name", required=True)
            out.referenced.add(name)
            parts.append(name)
        else:
            parts.append(_part(item, kind, where, "tool"))
    return {"role": "tool", "tool_call_id": call_id, "content": joined(parts)}


def _part(block: dict, kind: str, param: str, role: str) -> str | dict:
    """A text, image or document block, as a text or a media part of the engine's message."""
    if kind == "text":
        return field(block, "text", str, f"{param}.text", required=True)
    if kind == "image":
        return _image(block, param, role)
    if kind == "document":
        return _document(block, param)
    raise invalid(f"Invalid value for '{param}.type': {kind!r}; this message takes text, image, document and "
                  "tool_result blocks.", param=f"{param}.type")


def _image(block: dict, param: str, role: str) -> str | dict:
    source = field(block, "source", dict, f"{param}.source", required=True)
    where = f"{param}.source"
    kind = field(source, "type", str, f"{where}.type", required=True)
    if kind == "base64":
        mime = field(source, "media_type", str, f"{where}.media_type", required=True).strip().lower()[:64]
        data = field(source, "data", str, f"{where}.data", required=True)
        if not mime.startswith("image/"):
            raise invalid(f"'{where}.media_type' is {mime!r}; an image block takes an image.",
                          param=f"{where}.media_type", code="media_unsupported")
        media = MediaPart("image", data, f"{where}.data", mime)
    elif kind == "url":
        url = field(source, "url", str, f"{where}.url", required=True)
        if not url.startswith(("http://", "https://")):
            raise invalid(f"'{where}.url' must be an http(s) URL.", param=f"{where}.url", code="media_unsupported")
        media = MediaPart("image", "", f"{where}.url", url=url)  # fetched if its host is listed
    else:
        raise invalid(f"'{where}.type' is {kind!r}: images are read from 'base64' or 'url' sources (this server "
                      "has no files API).", param=f"{where}.type", code="media_unsupported")
    if role not in ("user", "tool"):
        return media_note()
    return {"type": "image", "media": media}


def _document(block: dict, param: str) -> str:
    """A plain-text document is its text; a PDF or file is refused (nothing here reads one)."""
    source = field(block, "source", dict, f"{param}.source", required=True)
    if source.get("type") == "text":
        return field(source, "data", str, f"{param}.source.data", required=True)
    raise invalid(f"'{param}': only plain-text documents (source type 'text') are read here, not PDFs or files.",
                  param=f"{param}.source", code="media_unsupported")


def _assistant(blocks: list, where: str) -> dict:
    texts: list = []
    thoughts: list[str] = []
    calls: list[dict] = []
    for j, block in enumerate(blocks):
        param = f"{where}[{j}]"
        kind = _kind(block, param)
        if kind == "thinking":
            thoughts.append(field(block, "thinking", str, f"{param}.thinking", required=True))
            field(block, "signature", str, f"{param}.signature")  # taken and ignored
        elif kind == "redacted_thinking":
            continue  # Anthropic's encrypted reasoning: nothing here can read it
        elif kind == "tool_use":
            calls.append(_tool_use(block, param))
        elif kind in ("text", "image", "document"):
            texts.append(_part(block, kind, param, "assistant"))
        else:
            raise invalid(f"Invalid value for '{param}.type': {kind!r}; an assistant message takes text, "
                          "thinking, redacted_thinking and tool_use blocks.", param=f"{param}.type")
    # No text is "" rather than None, which some templates (SmolLM2's) cannot render.
    out: dict = {"role": "assistant", "content": joined(texts)}
    if thoughts:
        out["reasoning_content"] = "\n".join(thoughts)
    if calls:
        out["tool_calls"] = calls
    return out


def _tool_use(block: dict, param: str) -> dict:
    call_id = field(block, "id", str, f"{param}.id", required=True)
    name = field(block, "name", str, f"{param}.name", required=True)
    arguments = field(block, "input", dict, f"{param}.input", default={})
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
