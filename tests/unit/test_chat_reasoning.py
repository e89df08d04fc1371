"""Thinking in Chat Completions as each client asks for it (OpenRouter's `reasoning` object, which
Cline sends through OpenRouter-style providers) and the field each reads it from: the one its own
history carries, `reasoning` for an OpenRouter-style client, both where nothing tells."""

from __future__ import annotations

import json

import pytest

from looptrace.proxy.api.openai.chat.request import parse_chat

from server import sse_events

MODEL = "tiny-qwen"
USER = {"role": "user", "content": "Hi"}


@pytest.mark.parametrize("reasoning, thinking", [
    ({"enabled": True}, True), ({"enabled": False, "effort": "high"}, False), ({"effort": "high"}, True),
    ({"effort": "none"}, False), ({"max_tokens": 2048}, True), ({"max_tokens": 0}, False), ({}, True),
    ({"exclude": True}, True), (None, None),
])
def test_openrouters_reasoning_field_is_thinking(reasoning, thinking):
    request, _ = parse_chat({"model": "m", "messages": [USER], "reasoning": reasoning})
    assert request.enable_thinking is thinking


def test_the_other_ways_of_asking_come_first():
    both = {"model": "m", "messages": [USER], "reasoning": {"enabled": True}}
    assert parse_chat({**both, "reasoning_effort": "none"})[0].enable_thinking is False
    assert parse_chat({**both, "chat_template_kwargs": {"enable_thinking": False}})[0].enable_thinking is False


def reasoning_keys(app, messages, stream, **body):
    """The reasoning fields of the answer's message, or of its streamed deltas."""
    app.replay("Thinking it over.\n</think>\n\nHello.<|im_end|>")
    request = {"model": MODEL, "messages": messages, "stream": stream, **body}
    status, _, data = app.post(request, path="/v1/chat/completions")
    assert status == 200, data
    if stream:
        deltas = [e["choices"][0]["delta"] for e in sse_events(data) if isinstance(e, dict) and e.get("choices")]
        keys = {k for d in deltas for k in d if k.startswith("reasoning")}
        assert all("".join(d.get(k) or "" for d in deltas) == "Thinking it over." for k in keys)
        return keys
    message = json.loads(data)["choices"][0]["message"]
    return {k for k in message if k.startswith("reasoning") and message[k] == "Thinking it over."}


HISTORY = [USER, {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Again"}]


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("messages, body, fields", [
    ([USER], {}, {"reasoning_content", "reasoning"}),  # nothing tells: both
    ([USER], {"reasoning": {"effort": "medium"}}, {"reasoning"}),  # OpenRouter's client reads OpenRouter's field
    ([HISTORY[0], {**HISTORY[1], "reasoning_content": "Hm."}, HISTORY[2]], {"reasoning": {}}, {"reasoning_content"}),
    ([HISTORY[0], {**HISTORY[1], "reasoning": "Hm."}, HISTORY[2]], {}, {"reasoning"}),
    (HISTORY, {}, {"reasoning_content", "reasoning"}),  # a history without thinking says nothing
])
def test_thinking_goes_out_under_the_field_the_client_reads(replay_app, messages, body, fields, stream):
    assert reasoning_keys(replay_app, messages, stream, **body) == fields


@pytest.mark.parametrize("reasoning, param", [
    ({"enabled": "yes"}, "reasoning.enabled"), ({"max_tokens": -1}, "reasoning.max_tokens"), ("high", "reasoning"),
])
def test_a_malformed_reasoning_field_is_the_apis_400(replay_app, reasoning, param):
    status, answer = replay_app.call("POST", "/v1/chat/completions",
                                     {"model": MODEL, "messages": [USER], "reasoning": reasoning})
    assert (status, answer["error"]["type"], answer["error"]["param"]) == (400, "invalid_request_error", param), answer
