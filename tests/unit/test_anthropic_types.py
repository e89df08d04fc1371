"""Every object and stream event /v1/messages answers with validates against the anthropic Python SDK's
own types (the version pinned in pyproject.toml's test extra), strictly, and the SDK's own client
reads them: text, thinking, tool use, an answer cut by max_tokens, a stop sequence, refusals before
the stream and a failure in it."""

from __future__ import annotations

import json

import anthropic
import pytest
from anthropic.types import ErrorResponse, Message, MessageTokensCount, RawMessageStreamEvent
from pydantic import TypeAdapter

from looptrace.proxy.api import streaming

from app_thread import Wrapped
from messages_api import BASH, frames, post_messages, qwen_call

MODEL = "tiny-qwen"
STREAM_EVENT = TypeAdapter(RawMessageStreamEvent)
REASONED = "Let me think.\n</think>\n\nThe answer is 4.<|im_end|>"
TOOL_USE = "I will list them.\n</think>\n\n" + qwen_call("Bash", command="ls -la") + "<|im_end|>"
CUT = "Cut short by the budget, never finished"
STOPPED = "\n</think>\n\nOne, two, three, four.<|im_end|>"
CASES = [
    (REASONED, {}, "end_turn"),
    (TOOL_USE, {"tools": [BASH]}, "tool_use"),
    (CUT, {"max_tokens": 3}, "max_tokens"),
    (STOPPED, {"stop_sequences": ["three"]}, "stop_sequence"),
]


def body(**extra) -> dict:
    return {"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": "2+2?"}], **extra}


@pytest.mark.parametrize(("recorded", "extra", "reason"), CASES)
def test_answers_are_sdk_messages(replay_app, recorded, extra, reason):
    replay_app.replay(recorded)
    status, data = post_messages(replay_app, body(**extra))
    assert status == 200, data
    message = json.loads(data)
    Message.model_validate(message, strict=True)
    assert message["stop_reason"] == reason


@pytest.mark.parametrize(("recorded", "extra", "reason"), CASES)
def test_stream_events_are_sdk_events(replay_app, recorded, extra, reason):
    replay_app.replay(recorded)
    status, data = post_messages(replay_app, body(stream=True, **extra))
    assert status == 200, data
    events = frames(data)
    for kind, event in events:
        if kind == "ping":
            assert event == {"type": "ping"}
        else:
            STREAM_EVENT.validate_python(event, strict=True)
    assert events[-2][1]["delta"]["stop_reason"] == reason and events[-1][0] == "message_stop"


def sdk(replay_app) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=replay_app.url, api_key="unused", max_retries=0)


def test_the_sdk_reads_a_stream_into_the_message_it_would_have_got_whole(replay_app):
    """The SDK's own accumulation of the events (text, thinking with its signature, a tool's input
    parsed from input_json_delta) gives the same blocks as the answer not streamed."""
    replay_app.replay(TOOL_USE, TOOL_USE)
    client = sdk(replay_app)
    with client.messages.stream(model=MODEL, max_tokens=64, tools=[BASH],
                                messages=[{"role": "user", "content": "ls"}]) as stream:
        streamed = stream.get_final_message()
    whole = client.messages.create(model=MODEL, max_tokens=64, tools=[BASH],
                                   messages=[{"role": "user", "content": "ls"}])
    assert streamed.stop_reason == whole.stop_reason == "tool_use"
    strip = lambda m: [b.model_dump(exclude={"id"}) for b in m.content]  # noqa: E731 - call ids are random
    assert strip(streamed) == strip(whole)
    thinking, call = streamed.content
    assert thinking.thinking == "I will list them." and thinking.signature
    assert (call.name, call.input) == ("Bash", {"command": "ls -la"})
    # The conversation goes on with the blocks as the SDK hands them back, signature and all.
    replay_app.replay(REASONED)
    followed = client.messages.create(model=MODEL, max_tokens=64, tools=[BASH], messages=[
        {"role": "user", "content": "ls"}, {"role": "assistant", "content": streamed.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "a.txt"}]}])
    assert [b.type for b in followed.content] == ["thinking", "text"]


def test_count_tokens_is_the_sdks_count(replay_app):
    count = sdk(replay_app).messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "2+2?"}])
    MessageTokensCount.model_validate(count.model_dump(), strict=True)
    assert count.input_tokens > 0


def test_refusals_are_sdk_errors(replay_app):
    status, data = post_messages(replay_app, body(max_tokens=10**9, stream=True))
    assert status == 400
    ErrorResponse.model_validate(json.loads(data), strict=True)
    with pytest.raises(anthropic.NotFoundError) as found:
        sdk(replay_app).messages.create(model="claude-sonnet-4", max_tokens=8, messages=[{"role": "user", "content": "x"}])
    assert found.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError, match="temperature"):
        sdk(replay_app).messages.create(model=MODEL, max_tokens=8, extra_body={"temperature": 3},
                                        messages=[{"role": "user", "content": "x"}])


def test_a_failure_in_the_stream_is_an_sdk_error_event(replay_app, monkeypatch):
    monkeypatch.setattr(streaming, "KEEPALIVE_SECONDS", 0.2)
    replay_app.runtime.backend = Wrapped(replay_app.replay("Never.<|im_end|>"), fail_after=1)
    status, data = post_messages(replay_app, body(stream=True))
    assert status == 200
    events = frames(data)
    for kind, event in events[:-1]:
        if kind != "ping":
            STREAM_EVENT.validate_python(event, strict=True)
    kind, error = events[-1]
    assert kind == "error"
    ErrorResponse.model_validate(error, strict=True)
    assert error["error"]["type"] == "api_error" and "went away" in error["error"]["message"]
    # The SDK raises it.
    replay_app.runtime.backend = Wrapped(replay_app.replay("Never.<|im_end|>"), fail_after=1)
    with pytest.raises(anthropic.APIStatusError, match="went away"):
        with sdk(replay_app).messages.stream(model=MODEL, max_tokens=8,
                                             messages=[{"role": "user", "content": "x"}]) as stream:
            stream.get_final_message()


def test_pings_fill_a_silence_before_the_first_token(replay_app, monkeypatch):
    monkeypatch.setattr(streaming, "KEEPALIVE_SECONDS", 0.2)
    replay_app.runtime.backend = Wrapped(replay_app.replay(REASONED), delay=1.0)
    status, data = post_messages(replay_app, body(stream=True))
    assert status == 200, data
    kinds = [kind for kind, _ in frames(data)]
    first_block = kinds.index("content_block_start")
    assert kinds[0] == "message_start" and kinds[1:first_block].count("ping") >= 3
    assert kinds[-1] == "message_stop"
