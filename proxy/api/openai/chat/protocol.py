"""A Chat Completions request as it arrives, in one place: what each field may be, parsed once at the
door (`parse(ChatRequest, body)`); request.py turns it into the engine's request.

Fields the models do not name pass through as they do today (`extra="allow"`), and a null is absent:
an optional field's default is given where request.py reads it. What cannot be a type is said once
here: the limits on how many messages and tools are read (protocol.capped), and what a
tool's name may hold (it is written into the prompt, where `f<|im_end|>` must not become a token).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from looptrace.backends.events import TOP_N
from ...protocol import Protocol, ToolName, by_type, capped, one_of
from ...request_parts import MEDIA_PARTS, SEED_RANGE, Attachment
from ..service_tiers import ServiceTier

TEXT_PARTS = ("text", "input_text", "output_text")
REFUSAL = "refusal"  # an assistant's refusal part (OpenAI's SDKs send its content back as parts)
Role = Literal["system", "developer", "user", "assistant", "tool"]


class ContentPart(Attachment):
    """A text part, or an attachment (its fields read by request_parts.media_part)."""

    type: Literal[TEXT_PARTS + MEDIA_PARTS + (REFUSAL,)]  # a tuple in a Literal is its members
    text: str | None = None  # a text part's, required there
    refusal: str | None = None  # a refusal part's, required there


class CallFunction(Protocol):
    name: str
    arguments: str | dict[str, Any] | None = None  # a JSON string or the object; none is {}


class ToolCall(Protocol):
    """A past call of an assistant's turn."""

    type: Literal["function"] | None = None
    function: CallFunction
    id: Any = None  # kept when a string; an odd id is dropped, as before, not refused


class CustomCallInput(Protocol):
    name: str
    input: str


class CustomToolCall(Protocol):
    """A past call of a custom (free-form) tool: its one string input (custom_tools.py)."""

    type: Literal["custom"]
    custom: CustomCallInput
    id: Any = None


HistoryCall = one_of(by_type({"custom": "custom"}, "function", absent="function"),
                     function=ToolCall, custom=CustomToolCall)


class Message(Protocol):
    role: Role
    # Required of system and user turns (request.py says so); a tool's none is "", an assistant's None.
    content: str | list[ContentPart] | None = None
    reasoning_content: str | None = None  # an assistant's thinking, vLLM's name
    reasoning: str | None = None  # the same, as other servers name it
    tool_calls: list[HistoryCall] | None = None  # an assistant's
    tool_call_id: str | None = None  # a tool's: the call it answers
    name: str | None = None  # a tool's: the function that answered


class Function(Protocol):
    name: ToolName
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; none is an object without properties


class FunctionTool(Protocol):
    type: Literal["function"] | None = None
    function: Function


class Grammar(Protocol):
    definition: Any = None  # shown only when text: any other value is passed over, as before
    syntax: Any = None  # "lark", "regex"


class CustomFormat(Protocol):
    """A free-form tool's input: `{"type": "text"}`, or a grammar (`{"type": "grammar", "grammar":
    {"definition", "syntax"}}`), shown to the model since nothing here constrains to it."""

    type: Any = None
    grammar: Grammar | None = None


class CustomSpec(Protocol):
    name: ToolName
    description: str | None = None
    format: CustomFormat | None = None


class CustomTool(Protocol):
    """OpenAI's `type: "custom"` tool (GPT-5's freeform tools; Copilot CLI's apply_patch): one string in."""

    type: Literal["custom"]
    custom: CustomSpec


Tool = one_of(by_type({"custom": "custom"}, "function", absent="function"), function=FunctionTool, custom=CustomTool)


class CustomChoiceName(Protocol):
    name: Any = None  # held to the rule on names where the choice is checked against the tools


class CustomChoice(Protocol):
    """A custom tool forced, as OpenAI names it: `{"type": "custom", "custom": {"name": …}}`."""

    type: Literal["custom"]
    custom: CustomChoiceName


class ReasoningOptions(Protocol):
    """OpenRouter's `reasoning` field (Cline's, through OpenRouter-style providers)."""

    enabled: bool | None = None
    effort: str | None = None
    max_tokens: int | None = Field(None, ge=0)
    exclude: bool | None = None  # thinking kept out of the answer: the model still thinks


class StreamOptions(Protocol):
    include_usage: bool | None = None


class ChatTemplateKwargs(Protocol):
    enable_thinking: bool | None = None


class Sampling(Protocol):
    """The sampling settings every surface that decodes here takes (and looptrace's own routes: native/)."""

    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)  # -1: all tokens, as vLLM takes it
    seed: int | None = Field(None, ge=SEED_RANGE[0], le=SEED_RANGE[1])  # what a torch generator takes


class ChatRequest(Sampling):
    model: str
    messages: Annotated[list[Message], capped("messages", "messages")]
    tools: Annotated[list[Tool], capped("tools", "tools")] | None = None
    # Checked against the tools (request_parts.parse_tool_choice); a custom one read as CustomChoice, any
    # other object as sent: tried in this order, so that an object not a CustomChoice is still taken.
    tool_choice: Annotated[str | CustomChoice | dict[str, Any], Field(union_mode="left_to_right")] | None = None
    parallel_tool_calls: bool | None = None
    max_completion_tokens: int | None = Field(None, ge=1)  # OpenAI's newer name: read first
    max_tokens: int | None = Field(None, ge=1)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    n: int | None = None  # 1 only: one sequence is decoded per request
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=TOP_N)  # the backends report the TOP_N most likely
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    chat_template_kwargs: ChatTemplateKwargs | None = None
    reasoning_effort: str | None = None  # thinking unless "none", when enable_thinking is not given
    reasoning: ReasoningOptions | None = None  # the same, OpenRouter's way (reasoning.py)
    stop: str | list[str] | None = None  # at most MAX_STOPS of MAX_STOP_LENGTH (request.py)
    # vLLM's token extensions: the prompt's and the answer's ids, and logprobs' tokens as "token_id:N".
    return_token_ids: bool | None = None
    return_tokens_as_token_ids: bool | None = None
    service_tier: ServiceTier | None = None  # said back in the answer (service_tiers.py)
