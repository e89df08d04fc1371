"""A JSON integer of more digits than Python reads (4,300) is a 400 in the API's shape on every JSON
endpoint, even in a field looptrace ignores (issue 35, finding 2): json.loads raised a plain
ValueError ("Exceeds the limit (4300 digits) for integer string conversion"), answered as a 500.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

MODEL = "tiny-qwen"
LONG = "7" * 5_000
TRACE = "0" * 32

# Every POST that reads a JSON body, each with a body it would otherwise take (or refuse for other reasons).
ENDPOINTS = {
    "/v1/chat/completions": {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]},
    "/v1/responses": {"model": MODEL, "input": "Hi"},
    "/v1/messages": {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]},
    "/v1/messages/count_tokens": {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]},
    f"/v1/traces/{TRACE}/fork": {"index": 0, "token_id": 11},
    "/v1/score": {"prompt_ids": [1], "answer_ids": [2]},
    "/v1/generate": {"prompt_ids": [1]},
}


def post_text(app, path: str, text: str) -> tuple[int, dict]:
    request = urllib.request.Request(app.url + path, data=text.encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.mark.parametrize("number", [LONG, "-" + LONG], ids=["positive", "negative"])
@pytest.mark.parametrize("path", ENDPOINTS)
def test_a_number_of_5000_digits_is_a_400_on_every_json_endpoint(replay_app, path, number):
    # In a field nothing reads: the body is refused as it is parsed, before any field is looked at.
    text = json.dumps({**ENDPOINTS[path], "ignored": {"deep": [0]}}).replace("[0]", f"[{number}]")
    status, answer = post_text(replay_app, path, text)
    assert status == 400, answer
    if path.startswith("/v1/messages"):
        assert answer["type"] == "error" and answer["error"]["type"] == "invalid_request_error", answer
    else:
        assert answer["error"]["code"] == "invalid_json" and answer["error"]["type"] == "invalid_request_error"
    assert "more than 4,300 digits" in answer["error"]["message"], answer
    assert replay_app.call("GET", "/health")[0] == 200


def test_a_number_of_5000_digits_in_sent_arguments_is_a_400_naming_them(replay_app):
    # Arguments sent as a JSON string are parsed as a body is (validation.embedded_json).
    arguments = '{"n": ' + LONG + "}"
    status, answer = replay_app.call("POST", "/v1/chat/completions", {"model": MODEL, "messages": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                              "function": {"name": "f", "arguments": arguments}}]}]})
    assert status == 400, answer
    assert answer["error"]["param"] == "messages[1].tool_calls[0].function.arguments", answer
    assert "more than 4,300 digits" in answer["error"]["message"]


def test_a_number_of_4300_digits_is_read(replay_app):
    replay_app.replay("Ok.<|im_end|>")
    text = json.dumps({**ENDPOINTS["/v1/chat/completions"], "max_tokens": 2, "ignored": 0}).replace(
        '"ignored": 0', '"ignored": ' + "7" * 4_300)
    assert post_text(replay_app, "/v1/chat/completions", text)[0] == 200
