"""Every object and stream event looptrace answers with validates against the OpenAI SDK's own types
(the version pinned in pyproject.toml's test extra), strictly: a field the SDK requires that goes
missing, or a shape that drifts, fails here before a typed client or a strict proxy rejects it.

Representative requests through both APIs, streamed and not: text, reasoning, tool calls (function,
custom, namespace), logprobs, usage on and off, a refusal before the stream and a failure in it,
and an answer cut by its token budget."""

from __future__ import annotations

import json

import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent
from openai.types.shared import ErrorObject
from pydantic import TypeAdapter

from looptrace.proxy.api import streaming

from app_thread import Wrapped
from server import sse_events
from .test_responses import AGENTS, EXEC, PATCH, call, sse

MODEL = "tiny-qwen"
STREAM_EVENT = TypeAdapter(ResponseStreamEvent)
REASONED = "Let me think.\n</think>\n\nThe answer is 4.<|im_end|>"
FUNCTION = "\n</think>\n\n" + call("exec_command", cmd="ls") + "<|im_end|>"
CUSTOM = "\n</think>\n\n" + call("apply_patch", input="*** Begin Patch\n*** End Patch") + "<|im_end|>"
NAMESPACED = "\n</think>\n\n" + call("multi_agent_v1.close_agent", target="a1") + "<|im_end|>"
CHAT_TOOL = {"type": "function", "function": {"name": "exec_command", "parameters": EXEC["parameters"]}}


def strict(model, value: dict) -> None:
    """Validated as the SDK's pydantic model, in strict mode: no coercion of types either."""
    model.model_validate(value, strict=True)


# -- Chat Completions ---------------------------------------------------------------------------

def chat(replay_app, recorded: str, **body) -> tuple[int, bytes]:
    replay_app.replay(recorded)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "2+2?"}], **body}
    status, _, data = replay_app.post(body, path="/v1/chat/completions")
    return status, data


@pytest.mark.parametrize(("recorded", "extra"), [
    (REASONED, {}),
    (REASONED, {"logprobs": True, "top_logprobs": 3}),
    (FUNCTION, {"tools": [CHAT_TOOL]}),
    ("Cut short by the budget, never finished", {"max_tokens": 3}),
])
def test_chat_answers_are_sdk_objects(replay_app, recorded, extra):
    status, data = chat(replay_app, recorded, **extra)
    assert status == 200, data
    body = json.loads(data)
    strict(ChatCompletion, body)
    assert ChatCompletion.model_validate(body).model_dump(exclude_unset=True)["choices"][0]["finish_reason"] \
        == body["choices"][0]["finish_reason"]


@pytest.mark.parametrize("include_usage", [True, False])
@pytest.mark.parametrize(("recorded", "extra"), [
    (REASONED, {"logprobs": True, "top_logprobs": 2}),
    (FUNCTION, {"tools": [CHAT_TOOL]}),
    ("Cut short by the budget, never finished", {"max_tokens": 3}),
])
def test_chat_stream_chunks_are_sdk_chunks(replay_app, recorded, extra, include_usage):
    status, data = chat(replay_app, recorded, stream=True, stream_options={"include_usage": include_usage}, **extra)
    assert status == 200
    events = sse_events(data)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    for chunk in chunks:
        strict(ChatCompletionChunk, chunk)
    assert any(c.get("usage") for c in chunks) is include_usage


def test_chat_errors_are_sdk_errors(replay_app, monkeypatch):
    # Refused before the stream: an HTTP error whose body is the SDK's error object.
    status, data = chat(replay_app, "x", stream=True, max_tokens=10**9)
    assert status == 400
    strict(ErrorObject, json.loads(data)["error"])
    # Failed in the stream: the error frame the SDK raises from.
    monkeypatch.setattr(streaming, "KEEPALIVE_SECONDS", 0.2)
    replay_app.runtime.backend = Wrapped(replay_app.replay("Never.<|im_end|>"), fail_after=1)
    status, _, data = replay_app.post({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream": True},
                                      path="/v1/chat/completions")
    assert status == 200
    frames = [e for e in sse_events(data) if isinstance(e, dict)]
    for chunk in frames[:-1]:
        strict(ChatCompletionChunk, chunk)
    strict(ErrorObject, frames[-1]["error"])


# -- Responses ------------------------------------------------------------------------------------

def respond(replay_app, recorded: str, **body) -> tuple[int, bytes]:
    replay_app.replay(recorded)
    body = {"model": MODEL, "input": "Go.", "tools": [EXEC, PATCH, AGENTS], **body}
    status, _, data = replay_app.post(body)
    return status, data


@pytest.mark.parametrize(("recorded", "extra", "status"), [
    (REASONED, {}, "completed"),
    (FUNCTION, {}, "completed"),
    (CUSTOM, {}, "completed"),
    (NAMESPACED, {}, "completed"),
    ("Cut short by the budget, never finished", {"max_output_tokens": 3}, "incomplete"),
])
@pytest.mark.parametrize("stream", [False, True])
def test_responses_objects_and_events_are_sdk_types(replay_app, recorded, extra, status, stream):
    got, data = respond(replay_app, recorded, stream=stream, **extra)
    assert got == 200, data
    if not stream:
        body = json.loads(data)
        strict(Response, body)
        assert body["status"] == status
        return
    events = sse(data)
    for event in events:
        STREAM_EVENT.validate_python(event, strict=True)
    final = events[-1]
    assert final["type"] == f"response.{status}"
    strict(Response, final["response"])
    assert final["response"]["usage"]["input_tokens_details"] == {"cached_tokens": 0, "cache_write_tokens": 0}


def test_responses_failures_are_sdk_types(replay_app, monkeypatch):
    got, data = respond(replay_app, "x", stream=True, max_output_tokens=10**9)
    assert got == 400
    strict(ErrorObject, json.loads(data)["error"])
    monkeypatch.setattr(streaming, "KEEPALIVE_SECONDS", 0.2)
    replay_app.runtime.backend = Wrapped(replay_app.replay("Never.<|im_end|>"), fail_after=1)
    got, _, data = replay_app.post({"model": MODEL, "input": "x", "stream": True})
    assert got == 200
    events = sse(data)
    for event in events:
        STREAM_EVENT.validate_python(event, strict=True)
    assert events[-1]["type"] == "response.failed"
    strict(Response, events[-1]["response"])
