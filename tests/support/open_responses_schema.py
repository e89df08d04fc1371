"""The Open Responses specification's response object and stream events, as pydantic models: a port
of what its compliance suite validates with (the zod schemas it generates from
`public/openapi/openapi.json`), written here from that file as read at openresponses/openresponses
1e33c10 (`info.version` 2026-04-24): `ResponseResource` and the 24 events of `sse-parser.ts`'s union.

Faithful to zod's rules as the suite runs them: unknown keys are allowed (zod objects strip them); a
required key must be present even where null is allowed; an optional key may be absent but, unless
the schema allows null, not null (a pydantic default is not validated, an explicit null is); no
coercion (`validate`, strict mode: "1" is no integer, 1 is no boolean).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError


class Loose(BaseModel):
    model_config = ConfigDict(extra="allow")


# -- content ----------------------------------------------------------------------------------------

class InputTextContent(Loose):
    type: Literal["input_text"]
    text: str


class UrlCitationBody(Loose):
    type: Literal["url_citation"]
    url: str
    start_index: int
    end_index: int
    title: str


class TopLogProb(Loose):
    token: str
    logprob: float
    bytes: list[int]


class LogProb(TopLogProb):
    top_logprobs: list[TopLogProb]


class OutputTextContent(Loose):
    type: Literal["output_text"]
    text: str
    annotations: list[UrlCitationBody]
    logprobs: list[LogProb] = None  # optional, not nullable


class TextContent(Loose):
    type: Literal["text"]
    text: str


class SummaryTextContent(Loose):
    type: Literal["summary_text"]
    text: str


class ReasoningTextContent(Loose):
    type: Literal["reasoning_text"]
    text: str


class RefusalContent(Loose):
    type: Literal["refusal"]
    refusal: str


class InputImageContent(Loose):
    type: Literal["input_image"]
    image_url: str | None
    detail: Literal["low", "high", "auto"]


class InputFileContent(Loose):
    type: Literal["input_file"]
    filename: str = None
    file_url: str = None


class InputVideoContent(Loose):
    type: Literal["input_video"]
    video_url: str


Part = Annotated[Union[InputTextContent, OutputTextContent, TextContent, SummaryTextContent, ReasoningTextContent,
                       RefusalContent, InputImageContent, InputFileContent], Field(discriminator="type")]
MessagePart = Annotated[Union[InputTextContent, OutputTextContent, TextContent, SummaryTextContent,
                              ReasoningTextContent, RefusalContent, InputImageContent, InputFileContent,
                              InputVideoContent], Field(discriminator="type")]
OutputPart = Annotated[Union[InputTextContent, InputImageContent, InputFileContent], Field(discriminator="type")]

# -- items ------------------------------------------------------------------------------------------

Status = Literal["in_progress", "completed", "incomplete"]


class Message(Loose):
    type: Literal["message"]
    id: str
    status: Status
    role: Literal["user", "assistant", "system", "developer"]
    content: list[MessagePart]
    phase: Literal["commentary", "final_answer"] = None


class FunctionCall(Loose):
    type: Literal["function_call"]
    id: str
    call_id: str
    name: str
    arguments: str
    status: Status


class FunctionCallOutput(Loose):
    type: Literal["function_call_output"]
    id: str
    call_id: str
    output: str | list[OutputPart]
    status: Status


class ReasoningBody(Loose):
    type: Literal["reasoning"]
    id: str
    content: list[Part] = None
    summary: list[Part]
    encrypted_content: str = None


class CompactionBody(Loose):
    type: Literal["compaction"]
    id: str
    encrypted_content: str
    created_by: str = None


ItemField = Annotated[Union[Message, FunctionCall, FunctionCallOutput, ReasoningBody, CompactionBody],
                      Field(discriminator="type")]

# -- the response object ----------------------------------------------------------------------------


class IncompleteDetails(Loose):
    reason: str


class Error(Loose):
    code: str
    message: str


class FunctionTool(Loose):
    type: Literal["function"]
    name: str
    description: str | None
    parameters: dict[str, Any] | None
    strict: bool | None


class FunctionToolChoice(Loose):
    type: Literal["function"]
    name: str = None


class AllowedToolChoice(Loose):
    type: Literal["allowed_tools"]
    tools: list[FunctionToolChoice]
    mode: Literal["none", "auto", "required"]


class TextResponseFormat(Loose):
    type: Literal["text"]


class JsonObjectResponseFormat(Loose):
    type: Literal["json_object"]


class JsonSchemaResponseFormat(Loose):
    type: Literal["json_schema"]
    name: str
    description: str | None
    schema_: None = Field(alias="schema")
    strict: bool


class TextField(Loose):
    format: Union[TextResponseFormat, JsonObjectResponseFormat, JsonSchemaResponseFormat]
    verbosity: Literal["low", "medium", "high"] = None


class Reasoning(Loose):
    effort: Literal["none", "low", "medium", "high", "xhigh"] | None
    summary: Literal["concise", "detailed", "auto"] | None


class InputTokensDetails(Loose):
    cached_tokens: int


class OutputTokensDetails(Loose):
    reasoning_tokens: int


class Usage(Loose):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens_details: OutputTokensDetails


class ResponseResource(Loose):
    id: str
    object: Literal["response"]
    created_at: int
    completed_at: int | None
    status: str
    incomplete_details: IncompleteDetails | None
    model: str
    previous_response_id: str | None
    instructions: str | None
    output: list[ItemField]
    error: Error | None
    tools: list[FunctionTool]
    tool_choice: Union[FunctionToolChoice, Literal["none", "auto", "required"], AllowedToolChoice]
    truncation: Literal["auto", "disabled"]
    parallel_tool_calls: bool
    text: TextField
    top_p: float
    presence_penalty: float
    frequency_penalty: float
    top_logprobs: int
    temperature: float
    reasoning: Reasoning | None
    usage: Usage | None
    max_output_tokens: int | None
    max_tool_calls: int | None
    store: bool
    background: bool
    service_tier: str
    metadata: Any = Field(...)  # required, of any type
    safety_identifier: str | None
    prompt_cache_key: str | None


# -- stream events ----------------------------------------------------------------------------------

class _Event(Loose):
    sequence_number: int


class _Snapshot(_Event):
    response: ResponseResource


class ResponseCreated(_Snapshot):
    type: Literal["response.created"]


class ResponseQueued(_Snapshot):
    type: Literal["response.queued"]


class ResponseInProgress(_Snapshot):
    type: Literal["response.in_progress"]


class ResponseCompleted(_Snapshot):
    type: Literal["response.completed"]


class ResponseFailed(_Snapshot):
    type: Literal["response.failed"]


class ResponseIncomplete(_Snapshot):
    type: Literal["response.incomplete"]


class OutputItemAdded(_Event):
    type: Literal["response.output_item.added"]
    output_index: int
    item: ItemField | None


class OutputItemDone(_Event):
    type: Literal["response.output_item.done"]
    output_index: int
    item: ItemField | None


class _InItem(_Event):
    item_id: str
    output_index: int


class SummaryPartAdded(_InItem):
    type: Literal["response.reasoning_summary_part.added"]
    summary_index: int
    part: Part


class SummaryPartDone(_InItem):
    type: Literal["response.reasoning_summary_part.done"]
    summary_index: int
    part: Part


class ContentPartAdded(_InItem):
    type: Literal["response.content_part.added"]
    content_index: int
    part: Part


class ContentPartDone(_InItem):
    type: Literal["response.content_part.done"]
    content_index: int
    part: Part


class OutputTextDelta(_InItem):
    type: Literal["response.output_text.delta"]
    content_index: int
    delta: str
    logprobs: list[LogProb] = None
    obfuscation: str = None


class OutputTextDone(_InItem):
    type: Literal["response.output_text.done"]
    content_index: int
    text: str
    logprobs: list[LogProb] = None


class RefusalDelta(_InItem):
    type: Literal["response.refusal.delta"]
    content_index: int
    delta: str


class RefusalDone(_InItem):
    type: Literal["response.refusal.done"]
    content_index: int
    refusal: str


class ReasoningDelta(_InItem):
    type: Literal["response.reasoning.delta"]
    content_index: int
    delta: str
    obfuscation: str = None


class ReasoningDone(_InItem):
    type: Literal["response.reasoning.done"]
    content_index: int
    text: str


class ReasoningSummaryDelta(_InItem):
    type: Literal["response.reasoning_summary_text.delta"]
    summary_index: int
    delta: str
    obfuscation: str = None


class ReasoningSummaryDone(_InItem):
    type: Literal["response.reasoning_summary_text.done"]
    summary_index: int
    text: str


class AnnotationAdded(_InItem):
    type: Literal["response.output_text.annotation.added"]
    content_index: int
    annotation_index: int
    annotation: UrlCitationBody | None


class ArgumentsDelta(_InItem):
    type: Literal["response.function_call_arguments.delta"]
    delta: str
    obfuscation: str = None


class ArgumentsDone(_InItem):
    type: Literal["response.function_call_arguments.done"]
    arguments: str


class ErrorPayload(Loose):
    type: str
    code: str | None
    message: str
    param: str | None
    headers: dict[str, str] = None


class ErrorEvent(_Event):
    type: Literal["error"]
    error: ErrorPayload


StreamingEvent = Annotated[Union[
    ResponseCreated, ResponseQueued, ResponseInProgress, ResponseCompleted, ResponseFailed, ResponseIncomplete,
    OutputItemAdded, OutputItemDone, ContentPartAdded, ContentPartDone, OutputTextDelta, OutputTextDone,
    RefusalDelta, RefusalDone, ArgumentsDelta, ArgumentsDone, SummaryPartAdded, SummaryPartDone, ReasoningDelta,
    ReasoningDone, ReasoningSummaryDelta, ReasoningSummaryDone, AnnotationAdded, ErrorEvent,
], Field(discriminator="type")]

RESPONSE = TypeAdapter(ResponseResource)
EVENT = TypeAdapter(StreamingEvent)


def issues(adapter: TypeAdapter, value: object) -> list[str]:
    """What the schema finds wrong with `value`, one line each as zod's issues read (path: message);
    none when it validates."""
    try:
        adapter.validate_python(value, strict=True)
    except ValidationError as exc:
        return [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
    return []
