"""A Chat Completions request body → a `GenerationRequest`, refusing bad input with a precise 400."""

from __future__ import annotations

from dataclasses import dataclass

from looptrace.backends.events import TOP_N

from ....engine.request import GenerationRequest
from ...errors import invalid
from ...request_parts import (
    MAX_STOP_LENGTH,
    MAX_STOPS,
    MEDIA_PARTS,
    at_most,
    call_arguments,
    joined,
    media_note,
    media_part,
    parse_tool_choice,
    parse_tools,
    seed,
    temperature_and_top_p,
)
from ...validation import field, in_range, is_a

ROLES = ("system", "developer", "user", "assistant", "tool")


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


def parse_chat(body: dict) -> tuple[GenerationRequest, ChatOptions]:
    model = field(body, "model", str, "model", required=True)
    messages = [_message(m, i) for i, m in enumerate(at_most(_messages(body), "messages", "messages"))]
    tools = parse_tools(at_most(field(body, "tools", list, "tools") or [], "tools", "tools"))
    tool_choice = parse_tool_choice(body.get("tool_choice"), tools)

    max_tokens_param = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = field(body, max_tokens_param, int, max_tokens_param)
    in_range(max_tokens, max_tokens_param, 1)
    temperature, top_p = temperature_and_top_p(body)
    top_k = field(body, "top_k", int, "top_k")
    in_range(top_k, "top_k", -1)
    penalties = {name: field(body, name, float, name, default=0.0) for name in ("presence_penalty", "frequency_penalty")}
    for name, value in penalties.items():
        in_range(value, name, -2, 2)
    n = field(body, "n", int, "n", default=1)
    if n != 1:
        raise invalid("Only n=1 is supported: this server decodes one sequence per request.", param="n")

    logprobs = field(body, "logprobs", bool, "logprobs", default=False)
    top_logprobs = field(body, "top_logprobs", int, "top_logprobs")
    in_range(top_logprobs, "top_logprobs", 0, TOP_N)  # the backends report the five most likely tokens
    if top_logprobs and not logprobs:
        raise invalid("'top_logprobs' needs 'logprobs' set to true.", param="top_logprobs")

    stream = field(body, "stream", bool, "stream", default=False)
    stream_options = field(body, "stream_options", dict, "stream_options", default={})
    include_usage = field(stream_options, "include_usage", bool, "stream_options.include_usage", default=False)

    request = GenerationRequest(
        messages=messages,
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=field(body, "parallel_tool_calls", bool, "parallel_tool_calls", default=True),
        enable_thinking=_thinking(body),
        max_tokens=max_tokens,
        max_tokens_param=max_tokens_param,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        seed=seed(body),
        **penalties,
        stop=_stop(body.get("stop")),
        top_logprobs=(top_logprobs or 0) if logprobs else None,
    )
    return request, ChatOptions(model=model, stream=stream, include_usage=include_usage, logprobs=logprobs,
                                token_ids=field(body, "return_token_ids", bool, "return_token_ids", default=False),
                                tokens_as_ids=field(body, "return_tokens_as_token_ids", bool,
                                                    "return_tokens_as_token_ids", default=False))


def _messages(body: dict) -> list:
    messages = field(body, "messages", list, "messages", required=True)
    if not messages:
        raise invalid("'messages' must hold at least one message.", param="messages", code="empty_array")
    return messages


def _message(message: object, i: int) -> dict:
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise invalid(f"Invalid type for '{where}': expected an object.", param=where, code="invalid_type")
    role = field(message, "role", str, f"{where}.role", required=True)
    if role not in ROLES:
        raise invalid(f"Invalid value for '{where}.role': '{role}'; expected one of {', '.join(ROLES)}.",
                      param=f"{where}.role")
    # Chat templates know "system"; "developer" is OpenAI's newer name for the same turn.
    out: dict = {"role": "system" if role == "developer" else role, "content": _content(message, where, role)}
    if role == "assistant":
        reasoning = message.get("reasoning_content", message.get("reasoning"))
        if reasoning is not None:
            if not isinstance(reasoning, str):
                raise invalid(f"Invalid type for '{where}.reasoning_content': expected a string.",
                              param=f"{where}.reasoning_content", code="invalid_type")
            out["reasoning_content"] = reasoning
        calls = field(message, "tool_calls", list, f"{where}.tool_calls")
        if calls:
            out["tool_calls"] = [_history_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(calls)]
    elif role == "tool":
        out["tool_call_id"] = field(message, "tool_call_id", str, f"{where}.tool_call_id", default="")
        name = field(message, "name", str, f"{where}.name")
        if name:
            out["name"] = name
    return out


def _content(message: dict, where: str, role: str) -> str | list | None:
    content = message.get("content")
    if content is None:
        if role in ("assistant", "tool"):
            return None if role == "assistant" else ""
        raise invalid(f"Missing required parameter: '{where}.content'.", param=f"{where}.content",
                      code="missing_required_parameter")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(f"Invalid type for '{where}.content': expected a string or an array of content parts.",
                      param=f"{where}.content", code="invalid_type")
    parts: list = []
    for j, part in enumerate(content):
        param = f"{where}.content[{j}]"
        if not isinstance(part, dict):
            raise invalid(f"Invalid type for '{param}': expected an object.", param=param, code="invalid_type")
        kind = part.get("type")
        if kind in ("text", "input_text", "output_text"):
            parts.append(field(part, "text", str, f"{param}.text", required=True))
        elif kind in MEDIA_PARTS:
            parts.append(media_part(part, param) if role in ("user", "tool") else media_note())
        else:
            raise invalid(f"Invalid value for '{param}.type': {kind!r}.", param=f"{param}.type")
    return joined(parts)


def _history_call(call: object, where: str) -> dict:
    if not isinstance(call, dict):
        raise invalid(f"Invalid type for '{where}': expected an object.", param=where, code="invalid_type")
    function = field(call, "function", dict, f"{where}.function", required=True)
    name = field(function, "name", str, f"{where}.function.name", required=True)
    arguments = call_arguments(function.get("arguments", "{}"), f"{where}.function.arguments")
    out = {"type": "function", "function": {"name": name, "arguments": arguments}}
    call_id = call.get("id")
    if isinstance(call_id, str):
        out["id"] = call_id
    return out


def _thinking(body: dict) -> bool | None:
    kwargs = field(body, "chat_template_kwargs", dict, "chat_template_kwargs", default={})
    thinking = field(kwargs, "enable_thinking", bool, "chat_template_kwargs.enable_thinking")
    if thinking is not None:
        return thinking
    effort = body.get("reasoning_effort")
    if effort is None:
        return None
    if not isinstance(effort, str):
        raise invalid("Invalid type for 'reasoning_effort': expected a string.", param="reasoning_effort",
                      code="invalid_type")
    return effort != "none"




def _stop(stop: object) -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(is_a(s, str) for s in stops):
        raise invalid("Invalid type for 'stop': expected a string or an array of strings.", param="stop",
                      code="invalid_type")
    if len(stops) > MAX_STOPS or any(len(s) > MAX_STOP_LENGTH for s in stops):
        raise invalid(f"'stop' takes at most {MAX_STOPS} strings of at most {MAX_STOP_LENGTH} characters each.",
                      param="stop")
    return stops
