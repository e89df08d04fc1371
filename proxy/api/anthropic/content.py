"""Anthropic's `system` and `messages` (protocol.py's models) → the engine's messages (Hugging Face's
common format).

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
from ..request_parts import joined, media_note
from .protocol import (
    Base64Source, Block, DocumentBlock, ImageBlock, Message, RedactedThinkingBlock, TextBlock, TextSource,
    ThinkingBlock, ToolReferenceBlock, ToolResultBlock, ToolUseBlock, UrlSource,
)

# Claude Code's first system block: its billing metadata (version and a hash that changes between
# sessions), not words for the model. Dropped, as vLLM drops it: it would also defeat prefix caching.
BILLING_HEADER = "x-anthropic-billing-header:"


@dataclass(slots=True)
class Conversation:
    messages: list[dict] = default(default_factory=list)
    # Deferred tools (`defer_loading`) a tool_reference block loaded: they join the tools offered.
    referenced: set[str] = default(default_factory=set)


def conversation(system: str | list[Block] | None, messages: list[Message]) -> Conversation:
    """The places a 400 names are written only when one is: most requests have none to name."""
    out = Conversation()
    if system is not None:
        out.messages.append({"role": "system", "content": _system(system, "system")})
    if not messages:
        raise invalid("'messages' must hold at least one message.", param="messages", code="empty_array")
    for i, message in enumerate(messages):
        role, content = message.role, message.content
        if role == "system":
            out.messages.append({"role": "system", "content": _system(content, f"messages[{i}].content")})
        elif type(content) is str:
            out.messages.append({"role": role, "content": content})
        elif role == "user":
            _user(content, i, out)
        else:
            out.messages.append(_assistant(content, i))
    return out


def _system(system: str | list[Block], where: str) -> str:
    """A system prompt as a string or text blocks → its text."""
    if type(system) is str:
        return system
    texts = []
    for j, block in enumerate(system):
        if type(block) is not TextBlock:
            raise invalid(f"Invalid value for '{where}[{j}].type': a system prompt holds text blocks only.",
                          param=f"{where}[{j}].type")
        if not (j == 0 and block.text.startswith(BILLING_HEADER)):
            texts.append(block.text)
    return joined(texts)


def _user(blocks: list[Block], i: int, out: Conversation) -> None:
    parts: list = []
    for j, block in enumerate(blocks):
        kind = type(block)
        if kind is TextBlock:
            parts.append(block.text)
        elif kind is ToolResultBlock:
            if parts:  # what the user wrote before it stays before it
                out.messages.append({"role": "user", "content": joined(parts)})
                parts = []
            out.messages.append(_tool_result(block, i, j, out))
        else:
            parts.append(_part(block, f"messages[{i}].content[{j}]", "user"))
    if parts or not blocks:
        out.messages.append({"role": "user", "content": joined(parts)})


def _tool_result(block: ToolResultBlock, i: int, j: int, out: Conversation) -> dict:
    content = block.content
    if content is None or type(content) is str:
        return {"role": "tool", "tool_call_id": block.tool_use_id, "content": content or ""}
    parts = []
    for k, item in enumerate(content):
        kind = type(item)
        if kind is TextBlock:
            parts.append(item.text)
        elif kind is ToolReferenceBlock:  # Claude Code's tool search: the named deferred tool is loaded
            out.referenced.add(item.tool_name)
            parts.append(item.tool_name)
        else:
            parts.append(_part(item, f"messages[{i}].content[{j}].content[{k}]", "tool"))
    return {"role": "tool", "tool_call_id": block.tool_use_id, "content": joined(parts)}


def _part(block: Block, param: str, role: str) -> str | dict:
    """A text, image or document block, as a text or a media part of the engine's message."""
    kind = type(block)
    if kind is TextBlock:
        return block.text
    if kind is ImageBlock:
        return _image(block, param, role)
    if kind is DocumentBlock:
        return _document(block, param)
    raise invalid(f"Invalid value for '{param}.type': {block.type!r}; this message takes text, image, document and "
                  "tool_result blocks.", param=f"{param}.type")


def _image(block: ImageBlock, param: str, role: str) -> str | dict:
    source, where = block.source, f"{param}.source"
    if type(source) is Base64Source:
        mime = source.media_type.strip().lower()[:64]
        if not mime.startswith("image/"):
            raise invalid(f"'{where}.media_type' is {mime!r}; an image block takes an image.",
                          param=f"{where}.media_type", code="media_unsupported")
        media = MediaPart("image", source.data, f"{where}.data", mime)
    elif type(source) is UrlSource:
        if not source.url.startswith(("http://", "https://")):
            raise invalid(f"'{where}.url' must be an http(s) URL.", param=f"{where}.url", code="media_unsupported")
        media = MediaPart("image", "", f"{where}.url", url=source.url)  # fetched if its host is listed
    else:
        raise invalid(f"'{where}.type' is {source.type!r}: images are read from 'base64' or 'url' sources (this "
                      "server has no files API).", param=f"{where}.type", code="media_unsupported")
    if role not in ("user", "tool"):
        return media_note()
    return {"type": "image", "media": media}


def _document(block: DocumentBlock, param: str) -> str:
    """A plain-text document is its text; a PDF or file is refused (nothing here reads one)."""
    if type(block.source) is TextSource:
        return block.source.data
    raise invalid(f"'{param}': only plain-text documents (source type 'text') are read here, not PDFs or files.",
                  param=f"{param}.source", code="media_unsupported")


def _assistant(blocks: list[Block], i: int) -> dict:
    texts: list = []
    thoughts: list[str] = []
    calls: list[dict] = []
    for j, block in enumerate(blocks):
        kind = type(block)
        if kind is TextBlock:
            texts.append(block.text)
        elif kind is ToolUseBlock:
            calls.append({"id": block.id, "type": "function", "function": {
                "name": block.name, "arguments": block.input if block.input is not None else {}}})
        elif kind is ThinkingBlock:
            thoughts.append(block.thinking)
        elif kind is RedactedThinkingBlock:
            continue
        elif kind is ImageBlock or kind is DocumentBlock:
            texts.append(_part(block, f"messages[{i}].content[{j}]", "assistant"))
        else:
            raise invalid(f"Invalid value for 'messages[{i}].content[{j}].type': {block.type!r}; an assistant message "
                          "takes text, thinking, redacted_thinking and tool_use blocks.",
                          param=f"messages[{i}].content[{j}].type")
    # No text is "" rather than None, which some templates (SmolLM2's) cannot render.
    out: dict = {"role": "assistant", "content": joined(texts)}
    if thoughts:
        out["reasoning_content"] = "\n".join(thoughts)
    if calls:
        out["tool_calls"] = calls
    return out
