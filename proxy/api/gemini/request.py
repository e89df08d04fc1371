"""A Gemini `generateContent` body → a `GenerationRequest`: parsed once into protocol.py's models (a 400
naming the place of anything wrong), then converted.

The model is the path's: this server serves one, and every name maps to it (Gemini CLI asks for
several, `gemini-2.5-flash-lite` for its utility calls among them). `responseMimeType` with
`responseSchema`/`responseJsonSchema` is accepted and not enforced (said once in the log, and on each
request's trace): nothing here constrains decoding, so the answer is whatever the model writes. A
`thinkingBudget` turns thinking on or off and is not held to (no family here has a budget knob):
recorded too. `safetySettings`, `cachedContent` and the other fields Google's servers act on are
accepted and ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...engine.request import GenerationRequest
from ..errors import invalid
from ..protocol import parse
from ..request_parts import warn_once
from .content import conversation
from .protocol import CountTokensRequest, GenerateContentRequest, GenerationConfig, ThinkingConfig, Tool, ToolConfig

# Google's OpenAPI subset names types in capitals; JSON Schema (what templates and tool_schema.py read)
# in lower case.
_SCHEMA_CHILDREN = ("items", "anyOf", "any_of", "properties")


@dataclass(slots=True)
class GeminiOptions:
    include_thoughts: bool = False  # thought parts in the answer (thinkingConfig.includeThoughts)
    # Asked for and not acted on: recorded on the trace (generate.py).
    response_mime_type: str | None = None
    response_schema: object = None  # responseJsonSchema, else responseSchema, as given
    thinking_budget: int | None = None
    thinking_level: str | None = None


def parse_generate(body: dict) -> tuple[GenerationRequest, GeminiOptions]:
    return convert(parse(GenerateContentRequest, body))


def parse_count(body: dict) -> GenerationRequest:
    """`:countTokens`: its `contents`, or its whole `generateContentRequest`."""
    request = parse(CountTokensRequest, body)
    if request.generate_content_request is not None:
        return convert(request.generate_content_request)[0]
    if request.contents is None:
        raise invalid("Missing required parameter: 'contents'.", param="contents", code="missing_required_parameter")
    return convert(GenerateContentRequest(contents=request.contents))[0]


def convert(request: GenerateContentRequest) -> tuple[GenerationRequest, GeminiOptions]:
    config = request.generation_config or GenerationConfig()
    if config.candidate_count not in (None, 1):
        raise invalid("'generationConfig.candidateCount' must be 1 here: one candidate is generated.",
                      param="generationConfig.candidateCount")
    if config.response_mime_type not in (None, "text/plain"):
        warn_once("gemini-response-schema", "a Gemini request asked for %r output: accepted, not enforced (said "
                  "once)", config.response_mime_type[:64])
    tools = _tools(request.tools)
    tool_choice, tools = _tool_choice(request.tool_config, tools)
    thinking = config.thinking_config
    generation = GenerationRequest(
        messages=conversation(request.system_instruction, request.contents),
        tools=tools,
        tool_choice=tool_choice,
        enable_thinking=_thinking(thinking),
        max_tokens=config.max_output_tokens,
        max_tokens_param="generationConfig.maxOutputTokens",
        temperature=config.temperature,
        top_p=config.top_p,
        top_k=config.top_k,
        seed=config.seed,
        presence_penalty=config.presence_penalty or 0.0,
        frequency_penalty=config.frequency_penalty or 0.0,
        stop=list(config.stop_sequences or ()),
    )
    schema = config.response_json_schema if config.response_json_schema is not None else config.response_schema
    return generation, GeminiOptions(
        include_thoughts=bool(thinking and thinking.include_thoughts),
        response_mime_type=config.response_mime_type, response_schema=schema,
        thinking_budget=thinking.thinking_budget if thinking else None,
        thinking_level=thinking.thinking_level if thinking else None)


def _tools(tools: list[Tool] | None) -> list[dict] | None:
    """Function declarations as the engine's OpenAI function tools; Google's own tools (googleSearch,
    codeExecution, …) run on Google's servers: dropped with a warning, not refused."""
    out = []
    for i, tool in enumerate(tools or ()):
        if tool.function_declarations is None:
            warn_once("gemini-google-tools", "dropped a Gemini tool that declares no functions (Google's own "
                      "tools run on Google's servers; said once)")
            continue
        for j, declaration in enumerate(tool.function_declarations):
            spec: dict = {"name": declaration.name}
            if declaration.description is not None:
                spec["description"] = declaration.description
            schema = declaration.parameters_json_schema
            if schema is None:
                schema = json_schema(declaration.parameters) if declaration.parameters is not None else None
            elif not isinstance(schema, dict):
                where = f"tools[{i}].functionDeclarations[{j}].parametersJsonSchema"
                raise invalid(f"Invalid type for '{where}': expected an object.", param=where, code="invalid_type")
            spec["parameters"] = schema if schema is not None else {"type": "object", "properties": {}}
            out.append({"type": "function", "function": spec})
    return out or None


def json_schema(schema: object) -> object:
    """Google's Schema (`type: "STRING"`, …) as JSON Schema: its types in lower case, throughout."""
    if isinstance(schema, list):
        return [json_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "type" and isinstance(value, str):
            value = value.lower()
        elif key == "properties" and isinstance(value, dict):
            value = {name: json_schema(child) for name, child in value.items()}
        elif key in _SCHEMA_CHILDREN:
            value = json_schema(value)
        out["anyOf" if key == "any_of" else key] = value
    return out


def _tool_choice(config: ToolConfig | None, tools: list[dict] | None) -> tuple[str | dict, list[dict] | None]:
    """functionCallingConfig → (the engine's tool_choice, the tools offered): ANY is a call required,
    of one of `allowedFunctionNames` where it names some; NONE no call."""
    calling = config.function_calling_config if config is not None else None
    if calling is None:
        return "auto", tools
    mode = calling.mode or "AUTO"
    if mode == "NONE":
        return "none", tools
    allowed = calling.allowed_function_names
    if allowed:
        names = {t["function"]["name"] for t in tools or ()}
        for k, name in enumerate(allowed):
            if name not in names:
                where = f"toolConfig.functionCallingConfig.allowedFunctionNames[{k}]"
                raise invalid(f"'{where}' names the function {name[:128]!r}, which is not declared.", param=where)
        tools = [t for t in tools or () if t["function"]["name"] in set(allowed)]
    if mode == "ANY":
        if not tools:
            raise invalid("'toolConfig.functionCallingConfig.mode' is ANY but no functions were declared.",
                          param="toolConfig.functionCallingConfig.mode")
        return ({"name": tools[0]["function"]["name"]} if len(tools) == 1 else "required"), tools
    return "auto", tools


def _thinking(config: ThinkingConfig | None) -> bool | None:
    """thinkingBudget 0 (or thinkingLevel MINIMAL) → thinking off; a positive budget or a level → on;
    -1 or nothing said → the template's own default. A budget is not enforced: maxOutputTokens bounds
    thinking and words together."""
    if config is None:
        return None
    budget, level = config.thinking_budget, config.thinking_level
    if budget == 0 or level == "MINIMAL":
        return False
    if (budget is not None and budget > 0) or level in ("LOW", "MEDIUM", "HIGH"):
        return True
    return None
