"""/v1/chat/completions over a real `looptrace serve` of the tiny Qwen3.5 checkpoint: shapes and errors."""

from __future__ import annotations

import json
import urllib.request

import pytest

from server import sse_events

CONTEXT = 512


@pytest.fixture(scope="module")
def server(serve, qwen3_5_dir):
    return serve(str(qwen3_5_dir), "--served-model-name", "tiny-qwen", "--max-model-len", str(CONTEXT))


def chat(server, **body):
    body.setdefault("model", "tiny-qwen")
    body.setdefault("messages", [{"role": "user", "content": "Hello there"}])
    return server.post("/v1/chat/completions", body)


def stream(server, **body):
    body.setdefault("model", "tiny-qwen")
    body.setdefault("messages", [{"role": "user", "content": "Hello there"}])
    body["stream"] = True
    req = urllib.request.Request(server.url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=120) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        return sse_events(response.read())


def test_health_and_models(server):
    status, health = server.get("/health")
    assert status == 200
    assert health["status"] == "ready" and health["family"] == "qwen3_5" and health["backend"] == "local"
    status, models = server.get("/v1/models")
    assert status == 200
    assert models["data"][0]["id"] == "tiny-qwen"
    assert models["data"][0]["max_model_len"] == CONTEXT
    assert models["data"][0]["owned_by"] == "looptrace"


def test_non_streaming_answer_with_usage(server):
    status, body = chat(server, max_tokens=6, temperature=0, chat_template_kwargs={"enable_thinking": False},
                        messages=[{"role": "user", "content": "A prompt no other test sends"}])
    assert status == 200, body
    choice = body["choices"][0]
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert choice["finish_reason"] == "length"
    assert isinstance(choice["message"]["content"], str) and choice["message"]["content"]
    usage = body["usage"]
    assert usage["completion_tokens"] == 6
    assert usage["total_tokens"] == usage["prompt_tokens"] + 6
    assert usage["completion_tokens_details"]["reasoning_tokens"] == 0
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0


def test_the_next_step_of_a_tool_loop_prefills_only_what_is_new(server):
    # An agent's loop: the next request is the last one plus the model's call and the tool's result.
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    settings = dict(tools=tools, max_tokens=4, temperature=0, chat_template_kwargs={"enable_thinking": False})
    asked = [{"role": "user", "content": "What is the weather in Oslo, for the prefix cache?"}]
    status, first = chat(server, messages=asked, **settings)
    assert status == 200, first
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    answered = asked + [{"role": "assistant", "content": "Let me look.", "tool_calls": [call]},
                        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"}]
    status, second = chat(server, messages=answered, **settings)
    assert status == 200, second
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == first["usage"]["prompt_tokens"]
    assert second["usage"]["prompt_tokens"] > first["usage"]["prompt_tokens"]
    # Sent again (a retry): the whole prompt is kept, and the answer is the same.
    status, again = chat(server, messages=answered, **settings)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == again["usage"]["prompt_tokens"]
    assert again["choices"][0]["message"] == second["choices"][0]["message"]
    kept = server.get("/health")[1]["prefix_cache"]
    assert kept["max_tokens"] == 65536 and 1 <= kept["prompts"] and again["usage"]["prompt_tokens"] <= kept["tokens"]


def test_streaming_matches_non_streaming_greedy(server):
    body = dict(max_tokens=8, temperature=0, chat_template_kwargs={"enable_thinking": False})
    status, whole = chat(server, **body)
    events = stream(server, stream_options={"include_usage": True}, **body)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert {c["id"] for c in chunks} == {chunks[0]["id"]}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == whole["choices"][0]["message"]["content"]
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert finish == ["length"]
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 8


def test_no_usage_chunk_unless_asked(server):
    events = stream(server, max_tokens=3, temperature=0)
    assert all("usage" not in e for e in events[:-1])


def test_thinking_is_on_by_default_for_qwen3_5(server):
    # The prompt ends inside <think>: a random model never closes it, so all of it is reasoning.
    status, body = chat(server, max_tokens=5, temperature=0)
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] and message["reasoning"] == message["reasoning_content"]
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 5
    status, body = chat(server, max_tokens=5, temperature=0, reasoning_effort="none")
    assert "reasoning_content" not in body["choices"][0]["message"]


def test_stop_string_cuts_the_answer(server):
    base = dict(max_tokens=12, temperature=0, chat_template_kwargs={"enable_thinking": False})
    _, whole = chat(server, **base)
    text = whole["choices"][0]["message"]["content"]
    cut = len(text) // 2
    stop = text[cut:cut + 3]
    _, body = chat(server, stop=[stop], **base)
    assert body["choices"][0]["message"]["content"] == text[: text.index(stop)]
    assert body["choices"][0]["finish_reason"] == "stop"


def test_seeded_sampling_repeats(server):
    body = dict(max_tokens=8, temperature=1.0, seed=5, chat_template_kwargs={"enable_thinking": False})
    assert chat(server, **body)[1]["choices"] == chat(server, **body)[1]["choices"]


def test_logprobs(server):
    status, body = chat(server, max_tokens=4, temperature=0, logprobs=True, top_logprobs=3,
                        chat_template_kwargs={"enable_thinking": False})
    entries = body["choices"][0]["logprobs"]["content"]
    assert len(entries) == 4
    for entry in entries:
        assert entry["logprob"] <= 0 and len(entry["top_logprobs"]) == 3
        assert entry["top_logprobs"][0]["logprob"] == pytest.approx(entry["logprob"])  # greedy took the top one
        assert bytes(entry["bytes"]).decode("utf-8", "replace") == entry["token"]
    # The parser drops whitespace at the start of the answer; the tokens keep it.
    assert "".join(e["token"] for e in entries).lstrip() == body["choices"][0]["message"]["content"]


@pytest.mark.parametrize("body, status, param, code, words", [
    ({"messages": [{"role": "user", "content": "hi"}]}, 400, "model", "missing_required_parameter", "model"),
    ({"model": "tiny-qwen"}, 400, "messages", "missing_required_parameter", "messages"),
    ({"model": "tiny-qwen", "messages": []}, 400, "messages", "empty_array", "at least one"),
    ({"model": "tiny-qwen", "messages": "hi"}, 400, "messages", "invalid_type", "array"),
    ({"model": "tiny-qwen", "messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0].role", "invalid_value", "wizard"),
    ({"model": "tiny-qwen", "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, 400, "temperature", "invalid_type", "number"),
    ({"model": "tiny-qwen", "messages": [{"role": "user", "content": "hi"}], "temperature": 3}, 400, "temperature", "invalid_value", "at most"),
    ({"model": "tiny-qwen", "messages": [{"role": "user", "content": "hi"}], "presence_penalty": 2.5}, 400, "presence_penalty", "invalid_value", "at most 2"),
    ({"model": "tiny-qwen", "messages": [{"role": "user", "content": "hi"}], "frequency_penalty": "lots"}, 400, "frequency_penalty", "invalid_type", "number"),
    ({"model": "tiny-qwen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, 400, "max_tokens", "invalid_value", "at least"),
    ({"model": "tiny-qwen", "messages": [{"role": "user", "content": "hi"}], "stream": "yes"}, 400, "stream", "invalid_type", "boolean"),
    ({"model": "tiny-qwen", "messages": [{"role": "user", "content": "hi"}], "n": 2}, 400, "n", "invalid_value", "n=1"),
    ({"model": "tiny-qwen", "messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 9}, 400, "top_logprobs", "invalid_value", "at most"),
    ({"model": "tiny-qwen", "messages": [{"role": "user", "content": "hi"}], "stop": 7}, 400, "stop", "invalid_type", "stop"),
    ({"model": "tiny-qwen", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": {"type": "function", "function": {"name": "g"}}}, 400, "tool_choice", "invalid_value", "'g'"),
    ({"model": "tiny-qwen", "messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{not json"}}]}]},
     400, "messages[0].tool_calls[0].function.arguments", "invalid_value", "not valid JSON"),
    ({"model": "tiny-qwen", "messages": [{"role": "user", "content": [{"type": "video", "video": "x"}]}]},
     400, "messages[0].content[0].type", "invalid_value", "'video'"),
    ({"model": "someone-else", "messages": [{"role": "user", "content": "hi"}]}, 404, "model", "model_not_found", "someone-else"),
])
def test_bad_requests_are_refused_in_openai_shape(server, body, status, param, code, words):
    got, error = server.post("/v1/chat/completions", body)
    assert got == status, error
    assert set(error["error"]) == {"message", "type", "param", "code"}
    assert error["error"]["param"] == param
    assert error["error"]["code"] == code
    assert words in error["error"]["message"]


def test_malformed_json(server):
    status, error = server.post("/v1/chat/completions", raw=b'{"model": "tiny-qwen", "messages": [')
    assert status == 400 and error["error"]["code"] == "invalid_json"
    assert error["error"]["type"] == "invalid_request_error"


def test_a_lone_surrogate_becomes_a_replacement_character(server):
    # JSON.stringify escapes half of a UTF-16 pair, e.g. in a tool output clipped between the halves.
    # json.dumps (ensure_ascii) sends the lone "\\ud800" escape; the pair "\\ud83d\\ude00" stays one character.
    content = "clipped \ud800 here, whole \U0001F600 there"
    body = {"model": "tiny-qwen", "max_tokens": 3, "messages": [{"role": "user", "content": content}]}
    before = server.newest_trace_id()
    for stream in (False, True):
        status, answer = server.post("/v1/chat/completions", raw=json.dumps({**body, "stream": stream}).encode())
        assert status == 200, answer
    trace = server.trace_after(before)
    render = next(s for s in trace["spans"] if s["name"] == "render")
    assert "clipped \ufffd here, whole \U0001F600 there" in render["attributes"]["looptrace.prompt.text"]


def test_a_late_developer_message_joins_the_system_prompt(server):
    # Qwen3.5's template alone would refuse it ("System message must be at the beginning.").
    messages = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello."}, {"role": "developer", "content": "Now read-only."},
                {"role": "user", "content": "Go on"}]
    before = server.newest_trace_id()
    status, body = chat(server, messages=messages, max_tokens=2)
    assert status == 200, body
    trace = server.trace_after(before)
    render = next(s for s in trace["spans"] if s["name"] == "render")
    assert render["attributes"]["looptrace.prompt.merged_system_messages"] == 1
    assert render["attributes"]["looptrace.prompt.text"].startswith("<|im_start|>system\nBe brief.\n\nNow read-only.")


def test_template_refusal_is_a_400(server):
    # The Qwen3.5 template itself refuses a conversation with no user turn.
    status, error = chat(server, messages=[{"role": "system", "content": "only a system prompt"}])
    assert status == 400 and error["error"]["code"] == "template_error"
    assert "No user query found in messages" in error["error"]["message"]


def test_a_prompt_longer_than_the_context_names_both_numbers(server):
    # Rendered, then counted: one token a word (five bytes a token, under the bound that counts
    # before rendering, families/prompt_length.py).
    status, error = chat(server, messages=[{"role": "user", "content": "word " * (CONTEXT + 10)}])
    assert status == 400 and error["error"]["code"] == "context_length_exceeded"
    message = error["error"]["message"]
    assert f"maximum context length is {CONTEXT} tokens" in message
    prompt_tokens = int(message.split("resulted in ")[1].split(" tokens")[0])
    assert prompt_tokens > CONTEXT
    # Far past it: found before rendering, with a lower bound.
    status, error = chat(server, messages=[{"role": "user", "content": "word " * (CONTEXT * 4)}])
    assert status == 400 and error["error"]["code"] == "context_length_exceeded"
    at_least = int(error["error"]["message"].split("resulted in at least ")[1].split(" tokens")[0])
    assert CONTEXT < at_least <= CONTEXT * 4 + 20


def test_max_tokens_that_cannot_fit(server):
    status, error = chat(server, max_completion_tokens=CONTEXT)
    assert status == 400 and error["error"]["param"] == "max_completion_tokens"
    assert f"of this model's {CONTEXT} tokens" in error["error"]["message"]


def test_unknown_route_and_method_answer_in_shape(server):
    status, error = server.get("/v1/nothing-here")
    assert status == 404 and error["error"]["code"] == "not_found"
    status, error = server.get("/v1/chat/completions")
    assert status == 405 and error["error"]["code"] == "method_not_allowed"


def test_an_attached_image_for_a_text_only_model_is_a_400_and_a_tool_s_image_a_note(server):
    # This checkpoint ships no image preprocessing: an image in a message is refused saying what the
    # model takes (tests/unit/test_media.py serves one that does); an image in a tool's output, which the
    # template renders as text, is a note the model reads in its place.
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    status, error = chat(server, messages=[{"role": "user", "content": [{"type": "text", "text": "What?"}, image]}],
                         max_tokens=2)
    assert status == 400 and error["error"]["code"] == "media_unsupported", error
    assert error["error"]["param"] == "messages[0].content[1].image_url.url" and "text only" in error["error"]["message"]
    before = server.newest_trace_id()
    status, body = chat(server, max_tokens=2, temperature=0, messages=[
        {"role": "user", "content": "Look at it."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "The screenshot:"}, image]}])
    assert status == 200, body
    render = next(s for s in server.trace_after(before)["spans"] if s["name"] == "render")
    assert "The screenshot:\n[an image or file was attached here; this server reads text only]" \
        in render["attributes"]["looptrace.prompt.text"]
