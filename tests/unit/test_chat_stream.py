"""Streaming /v1/chat/completions while the first token is slow to come: keepalive comments, and
refusals and failures on either side of the stream opening. In process (app_thread.py), with the
replay backend wrapped to be slow or to fail."""

from __future__ import annotations

import json

from openai import OpenAI

from looptrace.proxy.api import streaming
from looptrace.proxy.api.openai.chat import response as chat

from app_thread import Wrapped
from server import sse_events

MODEL = "tiny-qwen"
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


def chat_stream(replay_app, **body):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "stream": True, **NO_THINKING, **body}
    return replay_app.post(body, path="/v1/chat/completions")


def content(data: bytes) -> str:
    return "".join(e["choices"][0]["delta"].get("content") or "" for e in sse_events(data)
                   if isinstance(e, dict) and e.get("choices"))


def test_a_slow_first_token_gets_keepalive_comments(replay_app, monkeypatch):
    monkeypatch.setattr(streaming, "KEEPALIVE_SECONDS", 0.2)
    replay_app.runtime.backend = Wrapped(replay_app.replay("Late.<|im_end|>"), delay=1.0)
    status, kind, data = chat_stream(replay_app)
    assert status == 200 and kind.startswith("text/event-stream")
    # The role chunk opens the stream after one interval; then a comment per interval until the token.
    head, _, tail = data.partition(b"Late")
    assert head.startswith(b"data: ") and json.loads(head.split(b"\n")[0][6:])["choices"][0]["delta"]["role"] == "assistant"
    assert 2 <= head.count(chat.KEEPALIVE) <= 6 and chat.KEEPALIVE not in tail
    assert content(data) == "Late." and sse_events(data)[-1] == "[DONE]"


def test_the_openai_sdk_reads_through_the_keepalives(replay_app, monkeypatch):
    monkeypatch.setattr(streaming, "KEEPALIVE_SECONDS", 0.2)
    replay_app.runtime.backend = Wrapped(replay_app.replay("Late, but here.<|im_end|>"), delay=0.7)
    client = OpenAI(base_url=replay_app.url + "/v1", api_key="unused")
    chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hello"}],
                                                 stream=True, extra_body=NO_THINKING))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Late, but here."
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_a_quick_refusal_keeps_its_status_code(replay_app, caplog):
    replay_app.replay()  # nothing left to replay: the backend refuses at once, before the stream opens
    status, kind, data = chat_stream(replay_app)
    assert status == 503 and kind.startswith("application/json")
    assert json.loads(data)["error"]["code"] == "replay_exhausted"
    assert any("the backend failed with 503 replay_exhausted" in r.getMessage() for r in caplog.records)


def test_a_failure_after_the_stream_opened_is_an_error_frame(replay_app, monkeypatch, caplog):
    monkeypatch.setattr(streaming, "KEEPALIVE_SECONDS", 0.2)
    replay_app.runtime.backend = Wrapped(replay_app.replay("Never.<|im_end|>"), delay=0.5, fail_after=0)
    status, kind, data = chat_stream(replay_app)
    assert status == 200 and kind.startswith("text/event-stream")
    assert chat.KEEPALIVE in data
    error = next(e["error"] for e in sse_events(data) if isinstance(e, dict) and "error" in e)
    assert (error["code"], error["message"]) == ("upstream_error", "the upstream server went away")
    # The operator hears of it too, in one line: the status alone would say nothing of why.
    assert any("upstream_error: 'the upstream server went away'" in r.getMessage() for r in caplog.records
               if r.levelname == "WARNING")
