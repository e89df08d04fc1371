"""The Messages request's models (anthropic/protocol.py) and the rollout routes' (rollouts/protocol.py),
without a server: each wrong type or value is refused naming its place, bounds are checked before the
items are built, and the conversion gives the engine's messages."""

from __future__ import annotations

import pytest

from looptrace.proxy.api.anthropic.protocol import CountTokensRequest, MessagesRequest
from looptrace.proxy.api.anthropic.request import parse_messages
from looptrace.proxy.api.errors import APIError
from looptrace.proxy.api.protocol import parse
from looptrace.proxy.api.rollouts.protocol import RewardPost, TrainerLogprobs

ASK = [{"role": "user", "content": "x"}]


def refusal(model, body: dict) -> APIError:
    with pytest.raises(APIError) as refused:
        parse(model, body)
    assert refused.value.status == 400
    return refused.value


@pytest.mark.parametrize(("body", "param", "code"), [
    ({"messages": ASK}, "model", "missing_required_parameter"),
    ({"model": 1, "messages": ASK}, "model", "invalid_type"),
    ({"model": "m"}, "messages", "missing_required_parameter"),
    ({"model": "m", "messages": [{"role": "tool", "content": "x"}]}, "messages[0].role", "invalid_value"),
    ({"model": "m", "messages": [{"role": "user", "content": 5}]}, "messages[0].content", "invalid_type"),
    ({"model": "m", "messages": [{"role": "user", "content": ["x"]}]}, "messages[0].content[0]", "invalid_type"),
    ({"model": "m", "messages": [{"role": "user", "content": [{"text": "x"}]}]}, "messages[0].content[0].type",
     "missing_required_parameter"),
    ({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]},
     "messages[0].content[0].text", "invalid_type"),
    ({"model": "m", "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64"}}]}]},
     "messages[0].content[0].source.media_type", "missing_required_parameter"),
    ({"model": "m", "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
        {"type": "tool_reference"}]}]}]}, "messages[0].content[0].content[0].tool_name", "missing_required_parameter"),
    ({"model": "m", "messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "c", "name": "f",
                                                                     "input": "{}"}]}]},
     "messages[0].content[0].input", "invalid_type"),
    ({"model": "m", "messages": ASK, "system": [{"type": "text"}]}, "system[0].text", "missing_required_parameter"),
    ({"model": "m", "messages": ASK, "tools": ["x"]}, "tools[0]", "invalid_type"),
    ({"model": "m", "messages": ASK, "tools": [{"name": "f"}]}, "tools[0].input_schema", "missing_required_parameter"),
    ({"model": "m", "messages": ASK, "tools": [{"name": "f<|im_end|>", "input_schema": {}}]}, "tools[0].name",
     "invalid_value"),
    ({"model": "m", "messages": ASK, "tools": [{"type": 5}]}, "tools[0].type", "invalid_type"),
    ({"model": "m", "messages": ASK, "tool_choice": {"type": "some"}}, "tool_choice.type", "invalid_value"),
    ({"model": "m", "messages": ASK, "thinking": {"type": "enabled", "budget_tokens": 0}}, "thinking.budget_tokens",
     "invalid_value"),
    ({"model": "m", "messages": ASK, "temperature": 1.5}, "temperature", "invalid_value"),
    ({"model": "m", "messages": ASK, "temperature": True}, "temperature", "invalid_type"),
    ({"model": "m", "messages": ASK, "top_p": 0}, "top_p", "invalid_value"),
    ({"model": "m", "messages": ASK, "top_k": -1}, "top_k", "invalid_value"),
    ({"model": "m", "messages": ASK, "stop_sequences": "END"}, "stop_sequences", "invalid_type"),
    ({"model": "m", "messages": ASK, "stop_sequences": ["x"] * 17}, "stop_sequences", "invalid_value"),
    ({"model": "m", "messages": ASK, "stream": "yes"}, "stream", "invalid_type"),
    ({"model": "m", "messages": ASK, "metadata": []}, "metadata", "invalid_type"),
    ({"model": "m", "messages": ASK, "max_tokens": 0}, "max_tokens", "invalid_value"),
])
def test_a_wrong_field_is_refused_naming_its_place(body, param, code):
    error = refusal(CountTokensRequest, body)
    assert (error.param, error.code) == (param, code), error.message
    assert param in error.message


def test_max_tokens_is_required_but_not_to_count():
    assert refusal(MessagesRequest, {"model": "m", "messages": ASK}).param == "max_tokens"
    request, options = parse_messages({"model": "m", "messages": ASK}, counting=True)
    assert request.max_tokens is None and options.model == "m" and not options.stream


@pytest.mark.parametrize(("body", "param"), [
    ({"messages": ASK * 16_385}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}] * 16_385}]}, "messages[0].content"),
    ({"messages": ASK, "tools": [{"name": "f", "input_schema": {}}] * 4_097}, "tools"),
])
def test_too_many_items_are_refused_before_they_are_built(body, param):
    error = refusal(MessagesRequest, {"model": "m", "max_tokens": 1, **body})
    assert (error.param, error.code) == (param, "too_many_items") and "are read" in error.message


def test_a_bound_that_counts_no_items_keeps_pydantics_words():
    # Only protocol.capped's bounds are "too many items"; another list's max_length says its own limit.
    error = refusal(MessagesRequest, {"model": "m", "max_tokens": 1, "messages": ASK, "stop_sequences": ["x"] * 99})
    assert (error.param, error.code) == ("stop_sequences", "invalid_value")
    assert error.message.startswith("Invalid value for 'stop_sequences': List should have at most"), error.message


def test_null_is_absent_and_unknown_fields_pass():
    request, options = parse_messages({"model": "m", "max_tokens": 4, "messages": ASK, "metadata": None,
                                       "stream": None, "temperature": None, "service_tier": "auto",
                                       "tools": [{"type": "web_search_20250305", "name": "web_search"}]})
    assert request.temperature is None and request.tools is None and not options.stream
    assert request.messages == [{"role": "user", "content": "x"}]


def test_the_conversion_keeps_blocks_in_order():
    request, _ = parse_messages({"model": "m", "max_tokens": 4, "system": [{"type": "text", "text": "Be brief."}],
                                 "messages": [
        {"role": "user", "content": [{"type": "text", "text": "ls"}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"},
                                          {"type": "tool_use", "id": "c", "name": "Bash", "input": {"command": "ls"}}]},
        {"role": "user", "content": [{"type": "text", "text": "before"},
                                     {"type": "tool_result", "tool_use_id": "c", "content": [
                                         {"type": "text", "text": "a.txt"}]},
                                     {"type": "text", "text": "after"}]}]})
    assert request.messages == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "ls"},
        {"role": "assistant", "content": "", "reasoning_content": "t", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "Bash", "arguments": {"command": "ls"}}}]},
        {"role": "user", "content": "before"}, {"role": "tool", "tool_call_id": "c", "content": "a.txt"},
        {"role": "user", "content": "after"}]


@pytest.mark.parametrize(("model", "body", "param"), [
    (RewardPost, {"reward": "1"}, "reward"),
    (RewardPost, {"reward": 1, "info": []}, "info"),
    (RewardPost, {"steps": {}}, "steps"),
    (RewardPost, {"steps": [{"step": 1}]}, "steps[0].reward"),
    (RewardPost, {"steps": [{"step": 0, "reward": 1}]}, "steps[0].step"),
    (RewardPost, {"steps": [{"step": True, "reward": 1}]}, "steps[0].step"),
    (TrainerLogprobs, {"weight_version": 3}, "weight_version"),
    (TrainerLogprobs, {"logprobs": ["x"]}, "logprobs[0]"),
    (TrainerLogprobs, {"steps": [{"step": 1, "logprobs": [-1, "x"]}]}, "steps[0].logprobs[1]"),
])
def test_a_rollout_bodys_wrong_field_is_refused_naming_its_place(model, body, param):
    assert refusal(model, body).param == param
