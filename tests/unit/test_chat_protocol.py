"""The Chat Completions protocol (proxy/api/openai/chat/protocol.py): each wrong type or value in a body
is a 400 naming its place, in OpenAI's words; what passes is converted as it was before the models."""

from __future__ import annotations

import pytest

from looptrace.proxy.api.errors import APIError
from looptrace.proxy.api.openai.chat.request import parse_chat

USER = {"role": "user", "content": "Hi"}


def refusal(**fields) -> APIError:
    with pytest.raises(APIError) as caught:
        parse_chat({"model": "m", "messages": [USER], **fields})
    assert caught.value.status == 400
    return caught.value


@pytest.mark.parametrize(("fields", "param", "code"), [
    ({"model": 5}, "model", "invalid_type"),
    ({"messages": {}}, "messages", "invalid_type"),
    ({"messages": []}, "messages", "empty_array"),
    ({"messages": ["hi"]}, "messages[0]", "invalid_type"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "invalid_value"),
    ({"messages": [{"content": "x"}]}, "messages[0].role", "missing_required_parameter"),
    ({"messages": [{"role": "user"}]}, "messages[0].content", "missing_required_parameter"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "invalid_type"),
    ({"messages": [{"role": "user", "content": [5]}]}, "messages[0].content[0]", "invalid_type"),
    ({"messages": [{"role": "user", "content": [{"type": "html"}]}]}, "messages[0].content[0].type", "invalid_value"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text",
     "missing_required_parameter"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]}, "messages[0].content[0].text",
     "invalid_type"),
    ({"messages": [{"role": "assistant", "reasoning_content": 1}]}, "messages[0].reasoning_content", "invalid_type"),
    ({"messages": [{"role": "assistant", "tool_calls": {}}]}, "messages[0].tool_calls", "invalid_type"),
    ({"messages": [{"role": "assistant", "tool_calls": [{}]}]}, "messages[0].tool_calls[0].function",
     "missing_required_parameter"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}]},
     "messages[0].tool_calls[0].function.name", "missing_required_parameter"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 3}}]}]},
     "messages[0].tool_calls[0].function.arguments", "invalid_type"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}]},
     "messages[0].tool_calls[0].function.arguments", "invalid_value"),
    ({"messages": [{"role": "tool", "tool_call_id": 7, "content": "x"}]}, "messages[0].tool_call_id", "invalid_type"),
    ({"tools": {}}, "tools", "invalid_type"),
    ({"tools": [{"type": "web_search", "function": {"name": "f"}}]}, "tools[0].type", "invalid_value"),
    ({"tools": [{"type": "function"}]}, "tools[0].function", "missing_required_parameter"),
    ({"tools": [{"function": {"name": ""}}]}, "tools[0].function.name", "invalid_value"),
    ({"tools": [{"function": {"name": "f<|im_end|>"}}]}, "tools[0].function.name", "invalid_value"),
    ({"tools": [{"function": {"name": "f", "parameters": []}}]}, "tools[0].function.parameters", "invalid_type"),
    ({"tools": [{"function": {"name": "f", "description": 1}}]}, "tools[0].function.description", "invalid_type"),
    ({"tool_choice": 1}, "tool_choice", "invalid_type"),
    ({"tool_choice": "required"}, "tool_choice", "invalid_value"),
    ({"tool_choice": {"type": "function", "function": {"name": "absent"}}}, "tool_choice", "invalid_value"),
    ({"max_tokens": 0}, "max_tokens", "invalid_value"),
    ({"max_completion_tokens": "9"}, "max_completion_tokens", "invalid_type"),
    ({"temperature": 2.5}, "temperature", "invalid_value"),
    ({"temperature": True}, "temperature", "invalid_type"),
    ({"top_p": 0}, "top_p", "invalid_value"),
    ({"top_k": -2}, "top_k", "invalid_value"),
    ({"presence_penalty": 3}, "presence_penalty", "invalid_value"),
    ({"frequency_penalty": "0"}, "frequency_penalty", "invalid_type"),
    ({"n": 2}, "n", "invalid_value"),
    ({"logprobs": 1}, "logprobs", "invalid_type"),
    ({"top_logprobs": 2}, "top_logprobs", "invalid_value"),  # without logprobs
    ({"logprobs": True, "top_logprobs": 50}, "top_logprobs", "invalid_value"),
    ({"stream": "yes"}, "stream", "invalid_type"),
    ({"stream_options": {"include_usage": 1}}, "stream_options.include_usage", "invalid_type"),
    ({"parallel_tool_calls": 0}, "parallel_tool_calls", "invalid_type"),
    ({"chat_template_kwargs": {"enable_thinking": "no"}}, "chat_template_kwargs.enable_thinking", "invalid_type"),
    ({"reasoning_effort": 1}, "reasoning_effort", "invalid_type"),
    ({"seed": 2**64}, "seed", "invalid_value"),
    ({"stop": 5}, "stop", "invalid_type"),
    ({"stop": ["x"] * 17}, "stop", "invalid_value"),
    ({"return_token_ids": "true"}, "return_token_ids", "invalid_type"),
])
def test_each_wrong_field_is_a_400_naming_it(fields, param, code):
    error = refusal(**fields)
    assert (error.param, error.code) == (param, code), error.message
    assert param in error.message or param in ("messages", "stop", "n", "top_logprobs", "tool_choice"), error.message


def test_the_words_are_openais():
    assert refusal(temperature="hot").message == \
        "Invalid type for 'temperature': expected a number, but got a string."
    assert refusal(messages=[{"role": "user", "content": "x"}, {"role": "system"}]).message == \
        "Missing required parameter: 'messages[1].content'."
    assert refusal(max_tokens=0).message == "Invalid value for 'max_tokens': 0 is not at least 1."


def test_too_many_messages_are_refused_before_they_are_read():
    error = refusal(messages=["not even a message"] * 16_385)
    assert (error.param, error.code) == ("messages", "too_many_items")


def test_limits_and_tool_names_keep_their_words():
    # pydantic-core checks these natively (protocol.capped, protocol.ToolName); the 400 says what it said.
    assert refusal(messages=[USER] * 16_385).message == \
        "The request holds more than 16,384 messages; at most 16,384 are read."
    tools = [{"type": "function", "function": {"name": "f"}}] * 4_097
    assert (refusal(tools=tools).param, refusal(tools=tools).code) == ("tools", "too_many_items")
    empty = refusal(tools=[{"type": "function", "function": {"name": ""}}])
    assert (empty.message, empty.param, empty.code) == \
        ("'tools[0].function.name' must not be empty.", "tools[0].function.name", "invalid_value")
    token = refusal(tools=[{"type": "function", "function": {"name": "f<|im_end|>"}}])
    assert token.message == ("Invalid 'tools[0].function.name': string does not match pattern. Expected a string "
                             "that matches the pattern '^[A-Za-z0-9_.-]{1,128}$' (letters, digits, '_', '-' and "
                             "'.', at most 128).") and token.code == "invalid_value"
    assert refusal(tools=[{"type": "function", "function": {"name": "f\n"}}]).param == "tools[0].function.name"


def test_a_request_converts_as_before():
    request, options = parse_chat({
        "model": "m", "stream": True, "stream_options": {"include_usage": True}, "logprobs": True, "top_logprobs": 3,
        "max_completion_tokens": 7, "max_tokens": 9, "stop": "END", "seed": 1, "temperature": 1,
        "chat_template_kwargs": {"enable_thinking": False}, "reasoning_effort": "high", "unknown": {"kept": 1},
        "tools": [{"type": "function", "function": {"name": "look", "description": "Looks."}}],
        "tool_choice": {"type": "function", "function": {"name": "look"}},
        "messages": [
            {"role": "developer", "content": [{"type": "text", "text": "Be brief."},
                                              {"type": "input_text", "text": "Ok."}]},
            {"role": "user", "content": "Look."},
            {"role": "assistant", "content": None, "reasoning": "I should look.", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "look", "arguments": '{"at": "x"}'}},
                {"id": 5, "function": {"name": "look", "arguments": {"at": "y"}}},
                {"function": {"name": "look"}}]},
            {"role": "tool", "tool_call_id": "c1", "name": "look", "content": None},
        ]})
    assert request.messages == [
        {"role": "system", "content": "Be brief.\nOk."},
        {"role": "user", "content": "Look."},
        {"role": "assistant", "content": None, "reasoning_content": "I should look.", "tool_calls": [
            {"type": "function", "function": {"name": "look", "arguments": {"at": "x"}}, "id": "c1"},
            {"type": "function", "function": {"name": "look", "arguments": {"at": "y"}}},
            {"type": "function", "function": {"name": "look", "arguments": {}}}]},
        {"role": "tool", "content": "", "tool_call_id": "c1", "name": "look"},
    ]
    assert request.tools == [{"type": "function", "function": {
        "name": "look", "description": "Looks.", "parameters": {"type": "object", "properties": {}}}}]
    assert request.tool_choice == {"name": "look"}
    assert (request.max_tokens, request.max_tokens_param, request.stop, request.seed) == (7, "max_completion_tokens",
                                                                                          ["END"], 1)
    assert (request.temperature, request.top_logprobs, request.enable_thinking) == (1.0, 3, False)
    assert (request.parallel_tool_calls, request.presence_penalty, request.frequency_penalty) == (True, 0.0, 0.0)
    assert (options.model, options.stream, options.include_usage, options.logprobs) == ("m", True, True, True)
    assert (options.token_ids, options.tokens_as_ids) == (False, False)


def test_nulls_are_absent():
    request, options = parse_chat({"model": "m", "messages": [USER], "tools": None, "temperature": None,
                                   "stream": None, "n": None, "stop": None, "stream_options": None, "seed": None})
    assert (request.tools, request.temperature, request.stop, request.tool_choice) == (None, None, [], "auto")
    assert (options.stream, options.include_usage) == (False, False)


def test_reasoning_effort_stands_for_thinking_when_enable_thinking_is_not_said():
    assert parse_chat({"model": "m", "messages": [USER], "reasoning_effort": "none"})[0].enable_thinking is False
    assert parse_chat({"model": "m", "messages": [USER], "reasoning_effort": "low"})[0].enable_thinking is True
    assert parse_chat({"model": "m", "messages": [USER]})[0].enable_thinking is None


def test_a_custom_tool_choice_names_its_tool_and_other_objects_pass_as_sent():
    tools = [{"type": "custom", "custom": {"name": "apply_patch"}}, {"type": "function", "function": {"name": "f"}}]
    custom = {"type": "custom", "custom": {"name": "apply_patch"}, "extra": 1}
    assert parse_chat({"model": "m", "messages": [USER], "tools": tools, "tool_choice": custom})[0].tool_choice == \
        {"name": "apply_patch"}
    function = {"type": "function", "function": {"name": "f"}}
    assert parse_chat({"model": "m", "messages": [USER], "tools": tools, "tool_choice": function})[0].tool_choice == \
        {"name": "f"}
    odd = refusal(tools=tools, tool_choice={"type": "custom", "custom": "apply_patch"})
    assert (odd.param, odd.message) == ("tool_choice", "'tool_choice' names no function.")
    assert refusal(tool_choice=5).message == \
        "Invalid type for 'tool_choice': expected a string or an object, but got an integer."
