"""What a replay asks of a looptrace target (proxy/api/native/score.py, generate.py), on the tiny Qwen3.5 decoding here:
POST /v1/score reads a recorded answer back with the numbers its decoding reported, POST /v1/generate
decodes a recorded prompt again into the same tokens, text and tool calls; and each refuses what it
cannot do with a 4xx in the API's shape."""

from __future__ import annotations

import json

import pytest

MAX_TOKENS = 24
HEADERS = {"session_id": "targets-session"}
ASK = [{"role": "user", "content": "Name three rivers."}]
CALL = "<tool_call>\n<function=lookup>\n<parameter=river>\nNile\n</parameter>\n</function>\n</tool_call>"
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"river": {"type": "string"}}, "required": ["river"]}}}]


@pytest.fixture(scope="module")
def recorded(local_app):
    """A greedy answer's prompt ids, its tokens as stored, and the answer the client got."""
    status, answer = local_app.call("POST", "/v1/chat/completions", {
        "model": "tiny-qwen", "messages": ASK, "max_tokens": MAX_TOKENS, "temperature": 0,
        "chat_template_kwargs": {"enable_thinking": False}}, HEADERS)
    assert status == 200, answer
    trace_id = local_app.stored("/v1/sessions/targets-session")["steps"][-1]["trace_id"]
    trace = local_app.stored(f"/v1/traces/{trace_id}")
    render = next(s for s in trace["spans"] if s["name"] == "render")
    tokens = local_app.stored(f"/v1/traces/{trace_id}/tokens")["tokens"]
    return render["attributes"]["looptrace.prompt.ids"], tokens, answer


def test_score_reads_the_answer_back_as_it_was_decoded(local_app, recorded):
    prompt, tokens, _ = recorded
    status, scored = local_app.call("POST", "/v1/score", {"model": "tiny-qwen", "prompt_ids": prompt,
                                                          "answer_ids": [t["id"] for t in tokens]})
    assert status == 200, scored
    assert scored["model"] == "tiny-qwen" and scored["backend"] == "local" and len(scored["trace_id"]) == 32
    got = scored["tokens"]
    assert [s["id"] for s in got] == [t["id"] for t in tokens]
    assert [s["greedy_id"] for s in got] == [t["id"] for t in tokens]  # the answer was greedy
    assert [s["rank"] for s in got] == [1] * len(tokens)
    assert [s["logprob"] for s in got] == pytest.approx([t["logprob"] for t in tokens], rel=2e-3, abs=1e-4)
    assert [s["piece"] for s in got] == [t["piece"] for t in tokens]


def test_generate_decodes_the_prompt_again_into_the_same_answer(local_app, recorded):
    prompt, tokens, answer = recorded
    status, again = local_app.call("POST", "/v1/generate", {"prompt_ids": prompt, "max_tokens": MAX_TOKENS,
                                                            "temperature": 0})
    assert status == 200, again
    looptrace = again["looptrace"]
    assert [t["id"] for t in looptrace["tokens"]] == [t["id"] for t in tokens]
    assert [t["top_pieces"][0] for t in looptrace["tokens"]] == [t["top_pieces"][0] for t in tokens]
    assert looptrace["thinking"] is False  # read from the prompt's end, as the family reads it
    assert looptrace["text"] == answer["choices"][0]["message"]["content"]
    assert looptrace["finish_reason"] == again["choices"][0]["finish_reason"] == answer["choices"][0]["finish_reason"]
    assert looptrace["sampling"]["temperature"] == 0 and looptrace["tool_calls"] == []


def test_generate_parses_the_calls_of_an_answer_that_starts_inside_one(local_app, recorded):
    prompt, _, _ = recorded
    family = local_app.runtime.family
    prefix = family.tokenizer(CALL, add_special_tokens=False)["input_ids"]
    status, again = local_app.call("POST", "/v1/generate", {"prompt_ids": prompt, "answer_prefix": prefix,
                                                            "tools": TOOLS, "max_tokens": 1, "thinking": False})
    assert status == 200, again
    (call,) = again["looptrace"]["tool_calls"]
    assert (call["name"], json.loads(call["arguments"]), call["outcome"]) == ("lookup", {"river": "Nile"}, "valid")
    assert call["raw"] == CALL


@pytest.mark.parametrize("path, body, status, param", [
    ("/v1/score", {"prompt_ids": [1, 2], "answer_ids": []}, 400, "answer_ids"),
    ("/v1/score", {"prompt_ids": [1, 2], "answer_ids": [3, 10**9]}, 400, "answer_ids[1]"),
    ("/v1/score", {"prompt_ids": [1, "2"], "answer_ids": [3]}, 400, "prompt_ids[1]"),
    ("/v1/score", {"prompt_ids": [1, 2], "answer_ids": [3], "model": "other"}, 404, "model"),
    ("/v1/generate", {"prompt_ids": []}, 400, "prompt_ids"),
    ("/v1/generate", {"prompt_ids": [1, 2], "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/generate", {"prompt_ids": [1, 2], "tools": [{"type": "web_search"}]}, 400, "tools[0].type"),
])
def test_what_cannot_be_done_is_refused_in_the_apis_shape(local_app, path, body, status, param):
    got, error = local_app.call("POST", path, body)
    assert got == status, error
    assert error["error"]["param"] == param and error["error"]["message"]


SHORT = 64


@pytest.fixture(scope="module")
def short_app(qwen3_5_dir):
    """The tiny Qwen3.5 with a context of SHORT tokens: a score past it fits in a body (its own context,
    262,144 tokens, is as many ids as a body may hold values, so no body could go past it)."""
    from looptrace.proxy.settings import Settings

    from app_thread import AppThread

    app = AppThread(Settings(model=str(qwen3_5_dir), served_model_name="tiny-qwen", max_model_len=SHORT,
                             trace_db="off")).start()
    yield app
    app.stop()


def test_a_prompt_and_answer_past_the_context_are_refused(short_app):
    # The last answer token is read, never fed: prompt + answer - 1 rows must fit.
    status, scored = short_app.call("POST", "/v1/score", {"prompt_ids": [1] * 60, "answer_ids": [3] * 5})
    assert status == 200 and len(scored["tokens"]) == 5, scored
    status, error = short_app.call("POST", "/v1/score", {"prompt_ids": [1] * 60, "answer_ids": [3] * 6})
    assert status == 400 and error["error"]["code"] == "context_length_exceeded", error
    assert error["error"]["param"] == "answer_ids" and f"context of {SHORT}" in error["error"]["message"]


def test_ids_past_what_a_body_may_hold_are_refused_before_it_is_parsed(local_app):
    status, error = local_app.call("POST", "/v1/score", {"prompt_ids": [1] * 300_000, "answer_ids": [3]})
    assert (status, error["error"]["code"], error["error"]["param"]) == (400, "too_many_items", None), error


def test_the_replay_backend_has_no_model_to_score_with(replay_app):
    status, error = replay_app.call("POST", "/v1/score", {"prompt_ids": [1, 2], "answer_ids": [3]})
    assert (status, error["error"]["code"]) == (400, "score_unsupported")
    status, error = replay_app.call("POST", "/v1/generate", {"prompt_ids": [1, 2]})
    assert (status, error["error"]["code"]) == (400, "fork_unsupported")
