"""The Responses API's request, as models: the body of `POST /v1/responses` (and of input_tokens and
compact), its input items and tools, and the WebSocket mode's `response.create` envelope.

The fields follow the Open Responses specification (`CreateResponseBody`) and OpenAI's API reference;
those this server reads are typed, the rest are kept (extra) and echoed or ignored as before.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator

from ...protocol import Protocol, ToolName, by_type, one_of, refused
from ...request_parts import Attachment
from ..service_tiers import ServiceTier

MEDIA_PARTS = ("image_url", "input_image", "input_audio", "input_file", "file", "video_url")
TEXT_PARTS = ("input_text", "output_text", "text", "reasoning_text", "summary_text")


class Named(Protocol):
    """A call or a tool with a name: what the model will write in a call, so never a control token."""

    name: ToolName


# -- content parts --

class TextPart(Protocol):
    type: str | None = None
    text: str


class RefusalPart(Protocol):
    type: Literal["refusal"]
    refusal: str


class MediaPart(Attachment):
    """An image, audio, file or video: read as the engine reads attachments (request_parts.media_part)."""


_PART_KINDS = by_type({"refusal": "refusal", **dict.fromkeys(MEDIA_PARTS, "media"),
                       **dict.fromkeys(TEXT_PARTS, "text")}, None)


def _part_kind(part: dict) -> str | None:
    # A part with a string `text` is text, whatever its type says.
    return "text" if isinstance(part.get("text"), str) else _PART_KINDS(part)


Part = one_of(_part_kind, text=TextPart, refusal=RefusalPart, media=MediaPart)
Content = str | list[Part]


# -- input items --

class Message(Protocol):
    type: Literal["message"] = "message"
    role: Literal["system", "developer", "user", "assistant"]
    content: Content | None = None
    id: Any = None  # the client's, kept where the message is given back (a compaction's output)


class FunctionCall(Named):
    type: Literal["function_call"]
    call_id: str
    namespace: str | None = None
    arguments: Any = "{}"  # a JSON string (or an object): request_parts.call_arguments reads it


class CustomToolCall(Named):
    type: Literal["custom_tool_call"]
    call_id: str
    namespace: str | None = None
    input: str | None = None


class CallOutput(Protocol):
    type: Literal["function_call_output", "custom_tool_call_output"]
    call_id: str
    output: Content | None = None


class ReasoningPart(Protocol):
    type: Any = None
    text: Any = None


class Reasoning(Protocol):
    type: Literal["reasoning"]
    content: list[ReasoningPart] | None = None
    summary: list[ReasoningPart] | None = None
    encrypted_content: Any = None  # means nothing here


class Compaction(Protocol):
    """A compaction coming back: its `encrypted_content` references the summary (compaction/summaries.py)."""

    type: Literal["compaction", "compaction_summary"]
    encrypted_content: str


class CompactionTrigger(Protocol):
    """codex's remote compaction: the last input item asks for a summary."""

    type: Literal["compaction_trigger"]


class OtherItem(Protocol):
    """An item nothing here replays (a web search call, an item type to come): its text, if any, is
    said as the role's; otherwise it is skipped, with a warning."""

    type: str | None = None
    role: str | None = None
    text: Any = None
    content: Any = None
    output: Any = None

    def loose_text(self) -> str:
        if isinstance(self.text, str):
            return self.text
        content = self.content if self.content is not None else self.output
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            return "\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
        return ""


_ITEMS = {"message": "message", "function_call": "function_call", "custom_tool_call": "custom_tool_call",
          "function_call_output": "output", "custom_tool_call_output": "output", "reasoning": "reasoning",
          "compaction": "compaction", "compaction_summary": "compaction", "compaction_trigger": "trigger"}


_ITEM_KINDS = {True: by_type(_ITEMS, "other", absent="message"), False: by_type(_ITEMS, "other")}


def _item_kind(item: dict) -> str:
    # An item without a type is a message when it has a role (EasyInputMessage).
    return _ITEM_KINDS["role" in item](item)


Item = one_of(_item_kind, message=Message, function_call=FunctionCall, custom_tool_call=CustomToolCall,
              output=CallOutput, reasoning=Reasoning, compaction=Compaction, trigger=CompactionTrigger,
              other=OtherItem)


# -- tools --

class FunctionTool(Named):
    type: Literal["function"] = "function"
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class CustomFormat(Protocol):
    """A free-form tool's input: `{"type": "text"}`, or a grammar (`syntax`: lark, regex)."""

    type: Any = None
    syntax: Any = None
    definition: Any = None


class CustomTool(Named):
    type: Literal["custom"]
    description: str | None = None
    format: CustomFormat | None = None


class OtherTool(Protocol):
    """A tool nothing here can run (web search, tool search): dropped, never refused, since clients send
    them whatever the model."""

    type: str


Member = one_of(by_type({"function": "function", "custom": "custom"}, "other", absent="function"),
                function=FunctionTool, custom=CustomTool, other=OtherTool)


class NamespaceTool(Named):
    """Functions offered to the model as `namespace.tool` (codex's MCP servers)."""

    type: Literal["namespace"]
    tools: list[Member] = []


Tool = one_of(by_type({"function": "function", "custom": "custom", "namespace": "namespace"}, "other",
                      absent="function"),
              function=FunctionTool, custom=CustomTool, namespace=NamespaceTool, other=OtherTool)


class ToolChoice(Protocol):
    """`{"type": "function", "name": …}`, `{"type": "allowed_tools", "mode": …}`, a hosted tool's type."""

    type: Any = None
    name: Any = None
    namespace: Any = None
    mode: Any = None
    function: Any = None


# -- the request --

class ReasoningOptions(Protocol):
    effort: str | None = None
    summary: Any = None


class TextOptions(Protocol):
    format: dict[str, Any] | None = None  # accepted; output is not constrained to it


class ContextEntry(Protocol):
    type: str
    compact_threshold: int | None = None

    @field_validator("compact_threshold")
    @classmethod
    def _positive(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise refused("invalid_value", "'{param}' must be at least 1.")
        return value


class ClientMetadata(Protocol):
    """Members a client's metadata holds: codex's turn metadata, a JSON string (compaction/plan.py)."""

    codex_turn: Any = Field(None, alias="x-codex-turn-metadata")


class TurnMetadata(Protocol):
    """codex's turn metadata, as its JSON string holds it: `request_kind` "compaction" marks a compaction."""

    request_kind: Any = None


class ResponsesRequest(Protocol):
    model: str | None = None  # absent on codex desktop's follow-ups: default_model.py fills it in
    instructions: str | None = None
    input: str | list[Item] | None = None
    previous_response_id: str | None = None
    tools: list[Tool] | None = None
    tool_choice: str | ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = None  # (0, 1]: checked where it is read, in the words Chat Completions uses
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    reasoning: ReasoningOptions | None = None
    text: TextOptions | None = None
    stream: bool | None = None
    store: bool | None = None
    background: bool | None = None
    service_tier: ServiceTier | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    max_tool_calls: int | None = Field(None, ge=1)
    safety_identifier: str | None = Field(None, max_length=64)
    prompt_cache_key: str | None = None
    include: list[Any] | None = None
    metadata: dict[str, Any] | None = None
    client_metadata: ClientMetadata | None = None
    context_management: list[ContextEntry] | None = None
    enable_response_messages: bool | None = None  # vLLM's: the prompt's and the answer's token ids

    @property
    def items(self) -> list:
        """The input as items: a string is one user message."""
        if isinstance(self.input, str):
            return [Message(role="user", content=self.input)]
        return list(self.input or ())


# The WebSocket mode's events (OpenAI's "WebSocket mode" guide; the Open Responses specification's
# `x-openresponses-websocket`): each message names its type, and a lane by `stream_id`.
LANE_ID = re.compile(r"[A-Za-z0-9_.\-]{1,256}")  # what OpenAI's protocol allows a stream_id


class Envelope(Protocol):
    """What every message on the socket carries, read before the rest: where its answer goes."""

    model_config = {"extra": "ignore"}
    type: str
    stream_id: str | None = None


class Steer(Protocol):
    """`response.steer`, which this server refuses: what it asked is said back in the refusal."""

    model_config = {"extra": "ignore"}
    input: Any = None
    previous_response_id: Any = None


class ResponseCreate(ResponsesRequest):
    """`response.create`: a Responses request with the envelope's fields; `stream` is the transport's
    (always streamed), and `generate: false` warms a response up without generating."""

    type: Literal["response.create"]
    stream_id: str | None = None
    stream: Any = None  # HTTP's streaming switches: the socket always streams
    stream_options: Any = None
    generate: bool | None = None
