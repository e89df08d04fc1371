"""A Chat Completions request → a `GenerationRequest`: the body parsed once (protocol.py), then each
part converted to the engine's (Hugging Face's) message format. What a type cannot say is refused
here, with a precise 400: a turn's missing content, n, top_logprobs without logprobs, too many stops."""

from __future__ import annotations

from dataclasses import dataclass

from ....engine.request import GenerationRequest
from ...errors import invalid
from ...protocol import parse
from ...request_parts import MAX_STOP_LENGTH, MAX_STOPS, call_arguments, joined, media_note, media_part, \
    parse_tool_choice
from . import custom_tools
from ..service_tiers import served
from .protocol import REFUSAL, TEXT_PARTS, ChatRequest, ContentPart, CustomChoice, CustomTool, CustomToolCall, Message, \
    Tool, ToolCall
from .reasoning import BOTH, reasoning_fields, thinking_of


@dataclass(slots=True)
class ChatOptions:
    model: str
    stream: bool
    include_usage: bool
    logprobs: bool
    # vLLM's token extensions, as vLLM 0.32 answers them: the prompt's and the answer's ids, and logprobs'
    # tokens as "token_id:N".
    token_ids: bool = False
    tokens_as_ids: bool = False
    service_tier: str = "default"  # the tier the answer names (service_tiers.py)
    reasoning_fields: tuple[str, ...] = BOTH  # the fields thinking goes out under (reasoning.py)
    custom_tools: frozenset[str] = frozenset()  # the names of the custom tools offered (custom_tools.py)


def parse_chat(body: dict) -> tuple[GenerationRequest, ChatOptions]:
    return chat_request(parse(ChatRequest, body))


def chat_request(chat: ChatRequest) -> tuple[GenerationRequest, ChatOptions]:
    if not chat.messages:
        raise invalid("'messages' must hold at least one message.", param="messages", code="empty_array")
    messages = [_message(m, f"messages[{i}]") for i, m in enumerate(chat.messages)]
    tools = tools_of(chat.tools)
    if chat.n not in (None, 1):
        raise invalid("Only n=1 is supported: this server decodes one sequence per request.", param="n")
    logprobs = bool(chat.logprobs)
    if chat.top_logprobs and not logprobs:
        raise invalid("'top_logprobs' needs 'logprobs' set to true.", param="top_logprobs")
    max_tokens_param = "max_completion_tokens" if chat.max_completion_tokens is not None else "max_tokens"
    request = GenerationRequest(
        messages=messages,
        tools=tools,
        tool_choice=parse_tool_choice(_choice(chat.tool_choice), tools),
        parallel_tool_calls=chat.parallel_tool_calls is not False,
        enable_thinking=thinking_of(chat),
        max_tokens=chat.max_completion_tokens if chat.max_completion_tokens is not None else chat.max_tokens,
        max_tokens_param=max_tokens_param,
        temperature=chat.temperature,
        top_p=chat.top_p,
        top_k=chat.top_k,
        seed=chat.seed,
        presence_penalty=chat.presence_penalty or 0.0,
        frequency_penalty=chat.frequency_penalty or 0.0,
        stop=_stop(chat.stop),
        top_logprobs=(chat.top_logprobs or 0) if logprobs else None,
    )
    include_usage = bool(chat.stream_options and chat.stream_options.include_usage)
    return request, ChatOptions(model=chat.model, stream=bool(chat.stream), include_usage=include_usage,
                                service_tier=served(chat.service_tier),
                                logprobs=logprobs, token_ids=bool(chat.return_token_ids),
                                tokens_as_ids=bool(chat.return_tokens_as_token_ids),
                                reasoning_fields=reasoning_fields(chat),
                                custom_tools=frozenset(t.custom.name for t in chat.tools or ()
                                                       if isinstance(t, CustomTool)))


def tools_of(tools: list[Tool] | None) -> list[dict] | None:
    """Function tools in Chat Completions' shape, which the engine (and looptrace's /v1/generate) takes;
    a custom tool as the function of one string the model is shown."""
    if not tools:
        return None
    out = []
    for tool in tools:
        if isinstance(tool, CustomTool):
            out.append(custom_tools.as_function(tool))
            continue
        function = tool.function
        spec: dict = {"name": function.name}
        if function.description is not None:
            spec["description"] = function.description
        spec["parameters"] = function.parameters if function.parameters is not None else \
            {"type": "object", "properties": {}}
        out.append({"type": "function", "function": spec})
    return out


def _message(message: Message, where: str) -> dict:
    role = message.role
    # Chat templates know "system"; "developer" is OpenAI's newer name for the same turn.
    out: dict = {"role": "system" if role == "developer" else role, "content": _content(message, where)}
    if role == "assistant":
        reasoning = message.reasoning_content if message.reasoning_content is not None else message.reasoning
        if reasoning is not None:
            out["reasoning_content"] = reasoning
        if message.tool_calls:
            out["tool_calls"] = [_history_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(message.tool_calls)]
    elif role == "tool":
        out["tool_call_id"] = message.tool_call_id or ""
        if message.name:
            out["name"] = message.name
    return out


def _content(message: Message, where: str) -> str | list | None:
    content = message.content
    if content is None:
        if message.role in ("assistant", "tool"):
            return None if message.role == "assistant" else ""
        raise invalid(f"Missing required parameter: '{where}.content'.", param=f"{where}.content",
                      code="missing_required_parameter")
    if isinstance(content, str):
        return content
    media = message.role in ("user", "tool")  # a system prompt's or an assistant's attachment is a note
    return joined([_part(part, f"{where}.content[{j}]", media) for j, part in enumerate(content)])


def _part(part: ContentPart, param: str, media: bool) -> str | dict:
    if part.type == REFUSAL:  # an assistant's refusal, said again as its text
        if part.refusal is None:
            raise invalid(f"Missing required parameter: '{param}.refusal'.", param=f"{param}.refusal",
                          code="missing_required_parameter")
        return part.refusal
    if part.type in TEXT_PARTS:
        if part.text is None:
            raise invalid(f"Missing required parameter: '{param}.text'.", param=f"{param}.text",
                          code="missing_required_parameter")
        return part.text
    return media_part(part, param) if media else media_note()


def _history_call(call: ToolCall | CustomToolCall, where: str) -> dict:
    if isinstance(call, CustomToolCall):
        return custom_tools.history_call(call)
    arguments = call.function.arguments
    out = {"type": "function", "function": {
        "name": call.function.name,
        "arguments": call_arguments("{}" if arguments is None else arguments, f"{where}.function.arguments")}}
    if isinstance(call.id, str):
        out["id"] = call.id
    return out


def _choice(choice: str | CustomChoice | dict | None) -> str | dict | None:
    """A custom tool named as OpenAI names it (`{"type": "custom", "custom": {"name"}}`) → `{"name"}`."""
    if isinstance(choice, CustomChoice):
        return {"name": choice.custom.name}
    return choice


def _stop(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if len(stops) > MAX_STOPS or any(len(s) > MAX_STOP_LENGTH for s in stops):
        raise invalid(f"'stop' takes at most {MAX_STOPS} strings of at most {MAX_STOP_LENGTH} characters each.",
                      param="stop")
    return stops
