"""The Gemini API's requests, as models: the body of `:generateContent`, `:streamGenerateContent` and
`:countTokens`, its contents' parts, its tools and its generation config.

The fields follow Google's REST reference (the google-genai SDK's `GenerateContentParameters`, as it
sends them): camelCase, and the proto names in snake_case too, as Google's servers take both. Those
this server reads are typed; the rest (`safetySettings`, `cachedContent`, `labels`, a part's
`videoMetadata`, `thoughtSignature`, …) are kept as extra and ignored. A Part is one object with one
data field set (Google's oneof): which one, and what a role may send, is content.py's to say.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field
from pydantic.alias_generators import to_camel

from ..protocol import Protocol, capped, refused
from ..request_parts import MAX_STOP_LENGTH, MAX_STOPS
from ..validation import TOOL_NAME


class Gemini(Protocol):
    """camelCase on the wire (what the SDK and Gemini CLI send); snake_case taken as well."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


def _plain_name(name: str) -> str:
    """A function's name, as the model will write it in a call: never a control token (validation.py)."""
    if not TOOL_NAME.fullmatch(name):
        raise refused("invalid_value", "Invalid '{param}': a function name is letters, digits, '_', '-' and '.', "
                      "at most 128, not empty.")
    return name


FunctionName = Annotated[str, AfterValidator(_plain_name)]


# -- parts --

class Blob(Gemini):
    """inlineData: base64 bytes and their MIME type."""

    mime_type: str
    data: str


class FileData(Gemini):
    file_uri: str
    mime_type: str | None = None


class FunctionCall(Gemini):
    """A past call. Its name is not held to the rule on tools' names: the model wrote it, and it is
    rendered as the call's text. `id` is optional (the Gemini API names calls only sometimes)."""

    id: str | None = None
    name: str
    args: dict[str, Any] | None = None


class FunctionResponse(Gemini):
    id: str | None = None
    name: str
    response: dict[str, Any] | None = None


class Part(Gemini):
    text: str | None = None
    thought: bool | None = None  # a text part that is the model's reasoning
    inline_data: Blob | None = None
    file_data: FileData | None = None
    function_call: FunctionCall | None = None
    function_response: FunctionResponse | None = None


class Content(Gemini):
    """A turn: `user` or `model` (`function`, the older name of a turn of function responses, is the user's)."""

    role: Literal["user", "model", "function"] | None = None
    parts: Annotated[list[Part], capped("content parts", "parts")] | None = None


# -- tools --

class FunctionDeclaration(Gemini):
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None  # Google's OpenAPI subset (types in capitals): request.py converts it
    parameters_json_schema: Any = None  # a JSON Schema, as given


class Tool(Gemini):
    """Only functionDeclarations run here; Google's own tools (googleSearch, codeExecution, urlContext)
    run on Google's servers and are dropped (request.py)."""

    function_declarations: Annotated[list[FunctionDeclaration], capped("tools", "function_declarations")] | None = None


class FunctionCallingConfig(Gemini):
    mode: Literal["AUTO", "ANY", "NONE", "VALIDATED", "MODE_UNSPECIFIED"] | None = None
    allowed_function_names: list[str] | None = None


class ToolConfig(Gemini):
    function_calling_config: FunctionCallingConfig | None = None


# -- generation --

StopSequence = Annotated[str, Field(max_length=MAX_STOP_LENGTH)]


class ThinkingConfig(Gemini):
    include_thoughts: bool | None = None
    thinking_budget: Annotated[int, Field(ge=-1)] | None = None  # -1: the model's choice; 0: none
    thinking_level: Literal["MINIMAL", "LOW", "MEDIUM", "HIGH", "THINKING_LEVEL_UNSPECIFIED"] | None = None


class GenerationConfig(Gemini):
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    stop_sequences: Annotated[list[StopSequence], Field(max_length=MAX_STOPS)] | None = None
    candidate_count: Annotated[int, Field(ge=1)] | None = None  # 1 only (request.py)
    seed: int | None = None
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    # Gemini CLI's utility calls (JSON-mode classifiers) ask for JSON, with a JSON Schema or Google's
    # Schema (request.py): recorded, not enforced.
    response_mime_type: str | None = None
    response_json_schema: Any = None
    response_schema: Any = None
    thinking_config: ThinkingConfig | None = None


class GenerateContentRequest(Gemini):
    """The body of `:generateContent` and `:streamGenerateContent` (the model is the path's)."""

    contents: Annotated[list[Content], capped("messages", "contents")]
    system_instruction: Content | None = None
    tools: list[Tool] | None = None
    tool_config: ToolConfig | None = None
    generation_config: GenerationConfig | None = None


class CountTokensRequest(Gemini):
    """`:countTokens`: `contents`, or a whole `generateContentRequest` (system instruction and tools
    counted too, as they are rendered)."""

    contents: Annotated[list[Content], capped("messages", "contents")] | None = None
    generate_content_request: GenerateContentRequest | None = None
