"""Anthropic's Messages request, as models: the body of `POST /v1/messages` and of
`POST /v1/messages/count_tokens`, its messages' content blocks and its tools.

The fields follow Anthropic's API reference (the SDK's `MessageCreateParams`); those this server reads
are typed, the rest (`metadata`'s members, `service_tier`, `cache_control` on blocks, a document's `title`, …) are kept as extra and ignored. One union holds
every content block, as the SDK's does: which blocks a role may send is the conversion's to say
(content.py), in words that name the role.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from ..protocol import Protocol, ToolName, by_type, capped, one_of
from ..request_parts import MAX_STOP_LENGTH, MAX_STOPS

# -- sources of images and documents --

class Base64Source(Protocol):
    type: Literal["base64"]
    media_type: str
    data: str


class UrlSource(Protocol):
    type: Literal["url"]
    url: str


class TextSource(Protocol):
    """A plain-text document's."""

    type: Literal["text"]
    data: str


class OtherSource(Protocol):
    """A source nothing here reads (a file of the files API, a content source): refused by the block."""

    type: str


Source = one_of(by_type({"base64": "base64", "url": "url", "text": "text"}, "other"),
                base64=Base64Source, url=UrlSource, text=TextSource, other=OtherSource)


# -- content blocks --

class TextBlock(Protocol):
    type: Literal["text"]
    text: str


class ImageBlock(Protocol):
    type: Literal["image"]
    source: Source


class DocumentBlock(Protocol):
    type: Literal["document"]
    source: Source


class ToolUseBlock(Protocol):
    """A past call. Its name is not held to the rule on tools' names: the model wrote it, and it is
    rendered as the call's text, never as markup of the template's."""

    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any] | None = None


class ToolReferenceBlock(Protocol):
    """Claude Code's tool search, in a tool_result: the named deferred tool is loaded."""

    type: Literal["tool_reference"]
    tool_name: str


class ThinkingBlock(Protocol):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None  # taken and ignored


class RedactedThinkingBlock(Protocol):
    """Anthropic's encrypted reasoning: nothing here can read it."""

    type: Literal["redacted_thinking"]


class OtherBlock(Protocol):
    """A block of a type this server does not take: refused where it stands, naming what the role takes."""

    type: str


class ToolResultBlock(Protocol):
    type: Literal["tool_result"]
    tool_use_id: str
    # Accepted and not rendered: templates have no place for it, and Claude Code writes the error into
    # the result's text as well.
    is_error: bool | None = None
    content: str | list[Block] | None = None


_BLOCKS = ("text", "image", "document", "tool_use", "tool_result", "tool_reference", "thinking", "redacted_thinking")
Block = one_of(by_type({kind: kind for kind in _BLOCKS}, "other"),
               text=TextBlock, image=ImageBlock, document=DocumentBlock, tool_use=ToolUseBlock,
               tool_result=ToolResultBlock, tool_reference=ToolReferenceBlock, thinking=ThinkingBlock,
               redacted_thinking=RedactedThinkingBlock, other=OtherBlock)
ToolResultBlock.model_rebuild()


class Message(Protocol):
    """A `system` message (Claude Code sends one among the others) stays a system message."""

    role: Literal["user", "assistant", "system"]
    # The array first: of two refusals at one place, the 400 names the first branch's (too many parts).
    content: Annotated[list[Block], capped("content parts", "content")] | str


# -- tools --

class CustomTool(Protocol):
    """A client tool; with `defer_loading`, offered once a tool_reference loaded it."""

    type: Literal["custom"] | None = None
    name: ToolName
    description: str | None = None
    input_schema: dict[str, Any]
    defer_loading: bool | None = None


class ServerTool(Protocol):
    """One of Anthropic's server tools (web_search_20250305, …): run on Anthropic's servers, so dropped here."""

    type: str


Tool = one_of(by_type({None: "custom", "custom": "custom"}, "server"), custom=CustomTool, server=ServerTool)


class ToolChoice(Protocol):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None  # the tool, for "tool" (held to the rule on names there: request.py)
    disable_parallel_tool_use: bool | None = None


class Thinking(Protocol):
    """`enabled` with a budget, `adaptive`, or `disabled`."""

    type: Literal["enabled", "adaptive", "disabled"]
    budget_tokens: Annotated[int, Field(ge=1)] | None = None  # required when enabled (request.py)
    # Taken and not honoured (request.py): every thinking block is answered with its text.
    display: str | None = None


# -- context management (Claude Code's `context-management-2025-06-27` beta): context_edits.py --

class Threshold(Protocol):
    """{"type": "input_tokens" | "tool_uses" | "thinking_turns", "value": N}: which a field takes is
    context_edits.py's to say."""

    type: Literal["input_tokens", "tool_uses", "thinking_turns"]
    value: Annotated[int, Field(ge=0)]


class ClearToolUses(Protocol):
    type: Literal["clear_tool_uses_20250919"]
    trigger: Threshold | None = None  # input_tokens (100,000) or tool_uses
    keep: Threshold | None = None  # tool_uses (3): the latest kept
    clear_at_least: Threshold | None = None  # input_tokens: cleared only if that many go
    exclude_tools: list[str] | None = None
    clear_tool_inputs: bool | list[str] | None = None  # the calls' inputs too (all, or these tools')


class ClearThinking(Protocol):
    type: Literal["clear_thinking_20251015"]
    keep: Threshold | Literal["all"] | None = None  # thinking_turns (1): the latest kept


class OtherEdit(Protocol):
    """An edit of a type this server does not know: ignored (a newer client's), never refused."""

    type: str


Edit = one_of(by_type({"clear_tool_uses_20250919": "tool_uses", "clear_thinking_20251015": "thinking"}, "other"),
              tool_uses=ClearToolUses, thinking=ClearThinking, other=OtherEdit)


class ContextManagement(Protocol):
    edits: Annotated[list[Edit], Field(max_length=16)] | None = None


class OutputConfig(Protocol):
    effort: str | None = None  # low | medium | high | max: recorded, no family here has the knob


# -- the requests --

StopSequence = Annotated[str, Field(max_length=MAX_STOP_LENGTH)]


class CountTokensRequest(Protocol):
    """`POST /v1/messages/count_tokens`: a request with no max_tokens. Its sampling settings are
    checked as a request's are (a client counts the body it will send)."""

    model: str
    messages: Annotated[list[Message], capped("messages", "messages")]
    system: str | list[Block] | None = None
    tools: Annotated[list[Tool], capped("tools", "tools")] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=1)] | None = None  # Anthropic's range, not OpenAI's 0-2
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    stop_sequences: Annotated[list[StopSequence], Field(max_length=MAX_STOPS)] | None = None
    metadata: dict[str, Any] | None = None
    stream: bool | None = None
    # vLLM's return_token_ids, which Messages lacks there: the prompt's and the answer's ids.
    return_token_ids: bool | None = None
    context_management: ContextManagement | None = None
    output_config: OutputConfig | None = None


class MessagesRequest(CountTokensRequest):
    """`POST /v1/messages`."""

    max_tokens: Annotated[int, Field(ge=1)]
