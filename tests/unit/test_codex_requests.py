"""What codex's newer clients send that older ones did not: a `service_tier`, follow-ups without a
`model` (the desktop app), input items with ids the client minted, and several conversations on one
WebSocket, each in its `stream_id` lane. Each answer is checked against the openai SDK's own types."""

from __future__ import annotations

import json

import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseItemList

from .test_openai_types import strict
from .test_responses_websocket import SERVER_EVENT, raw_socket

MODEL = "tiny-qwen"
TEXT = "\n</think>\n\nDone.<|im_end|>"


@pytest.mark.parametrize(("asked", "served"), [("auto", "default"), ("default", "default"), ("flex", "flex"),
                                               ("priority", "priority"), (None, "default")])
def test_a_service_tier_is_accepted_and_said_back(replay_app, asked, served):
    replay_app.replay(TEXT)
    body = {"model": MODEL, "input": "Hi"} | ({"service_tier": asked} if asked else {})
    status, answered = replay_app.call("POST", "/v1/responses", body)
    assert status == 200, answered
    strict(Response, answered)
    assert answered["service_tier"] == served


@pytest.mark.parametrize("tier", ["turbo", "<b>{param}</b>", ""])
def test_an_unknown_service_tier_is_refused_in_openais_words(replay_app, tier):
    status, refused = replay_app.call("POST", "/v1/responses", {"model": MODEL, "input": "Hi", "service_tier": tier})
    assert status == 400, refused
    assert refused["error"] == {
        "message": "Invalid value for 'service_tier'. Supported values are: 'auto', 'default', 'flex', 'scale', and "
                   "'priority'.", "type": "invalid_request_error", "param": "service_tier", "code": "invalid_value"}


def test_a_follow_up_without_a_model_takes_the_previous_responses(replay_app):
    replay_app.replay(TEXT, TEXT, TEXT)
    status, first = replay_app.call("POST", "/v1/responses", {"model": MODEL, "input": "Hello."})
    assert status == 200, first
    status, second = replay_app.call("POST", "/v1/responses", {"previous_response_id": first["id"], "input": "More?"})
    assert status == 200, second
    strict(Response, second)
    assert second["model"] == MODEL and second["previous_response_id"] == first["id"]
    # No previous response either: the one model served.
    status, alone = replay_app.call("POST", "/v1/responses", {"input": "Hi"})
    assert (status, alone["model"]) == (200, MODEL), alone
    status, counted = replay_app.call("POST", "/v1/responses/input_tokens", {"input": "Hi"})
    assert status == 200 and counted["input_tokens"] > 0, counted
    # A previous response that is not there is said to be missing, not guessed around.
    status, missing = replay_app.call("POST", "/v1/responses", {"previous_response_id": "resp_gone", "input": "x"})
    assert (status, missing["error"]["code"]) == (404, "previous_response_not_found"), missing


def test_client_minted_item_ids_are_kept(replay_app):
    replay_app.replay(TEXT)
    odd = "item with spaces, <markup> & 'quotes' ✓"
    items = [
        {"type": "message", "id": "msg_client_1", "role": "user", "content": "Run it."},
        {"type": "function_call", "id": "fc_client_2", "call_id": "call_1", "name": "exec_command",
         "arguments": '{"cmd": "ls"}'},
        {"type": "function_call_output", "id": odd, "call_id": "call_1", "output": "a.txt"},
        {"type": "message", "role": "user", "content": "And?"},
    ]
    status, answered = replay_app.call("POST", "/v1/responses", {"model": MODEL, "input": items})
    assert status == 200, answered
    status, listed = replay_app.call("GET", f"/v1/responses/{answered['id']}/input_items?order=asc")
    assert status == 200, listed
    strict(ResponseItemList, listed)
    ids = [item["id"] for item in listed["data"]]
    assert ids[:3] == ["msg_client_1", "fc_client_2", odd], ids
    assert ids[3] and ids[3] not in ids[:3]  # the one without an id gets one made for it
    status, page = replay_app.call("GET", f"/v1/responses/{answered['id']}/input_items?order=asc&after=fc_client_2")
    assert [item["id"] for item in page["data"]] == ids[2:], page


def test_two_lanes_interleaved_on_one_socket_each_continue_their_own_conversation(replay_app):
    lanes = ("codex-main", "codex-review")
    replay_app.replay(*[TEXT] * 4)
    with raw_socket(replay_app) as ws:
        for lane in lanes:  # both lanes' first turns in flight at once
            ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": f"I am {lane}.",
                                "stream_id": lane, "store": False, "service_tier": "priority"}))
        first = ended(ws, 2)
        for lane in reversed(lanes):  # each follow-up names its lane's response, and no model
            ws.send(json.dumps({"type": "response.create", "previous_response_id": first[lane]["id"],
                                "input": f"Who am I? ({lane})", "stream_id": lane, "store": False}))
        second = ended(ws, 2)
        # A response this socket never made, on a lane of its own: typed, on that lane, and the socket goes on.
        ws.send(json.dumps({"type": "response.create", "model": MODEL, "previous_response_id": "resp_other",
                            "input": "x", "stream_id": "stray"}))
        error = json.loads(ws.recv(timeout=30))
    for lane in lanes:
        assert second[lane]["previous_response_id"] == first[lane]["id"]
        assert second[lane]["model"] == MODEL and first[lane]["service_tier"] == "priority"
        assert second[lane]["service_tier"] == "default"
    assert (error["type"], error["stream_id"], error["error"]["code"]) == \
        ("error", "stray", "previous_response_not_found"), error
    # Each lane's second prompt holds its own first turn and not the other lane's.
    traces = replay_app.stored("/v1/traces?limit=20")["data"]
    prompts = ["".join(t[1] for t in replay_app.stored(f"/v1/traces/{trace['trace_id']}/prompt")["tokens"] or ())
               for trace in traces]
    for lane, other in (lanes, tuple(reversed(lanes))):
        (text,) = [prompt for prompt in prompts if f"Who am I? ({lane})" in prompt]
        assert f"I am {lane}." in text and f"I am {other}." not in text, text


def ended(ws, count: int) -> dict[str, dict]:
    """The completed responses of `count` turns, by lane; every event checked and carrying its lane."""
    done: dict[str, dict] = {}
    while len(done) < count:
        event = json.loads(ws.recv(timeout=30))
        SERVER_EVENT.validate_python(event, strict=True)
        assert event["type"] != "error", event
        assert "stream_id" in event, event
        if event["type"] == "response.completed":
            done[event["stream_id"]] = event["response"]
    return done


def test_chat_completions_says_its_service_tier(replay_app):
    replay_app.replay(TEXT, TEXT)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "service_tier": "flex"}
    status, answered = replay_app.call("POST", "/v1/chat/completions", body)
    assert status == 200, answered
    strict(ChatCompletion, answered)
    assert answered["service_tier"] == "flex"
    status, kind, data = replay_app.post({**body, "service_tier": "auto", "stream": True}, "/v1/chat/completions")
    assert status == 200, data
    chunks = [json.loads(line[6:]) for line in data.decode().splitlines()
              if line.startswith("data: {")]
    for chunk in chunks:
        strict(ChatCompletionChunk, chunk)
    assert chunks and {chunk["service_tier"] for chunk in chunks} == {"default"}, chunks
    status, refused = replay_app.call("POST", "/v1/chat/completions", {**body, "service_tier": "fastest"})
    assert (status, refused["error"]["param"], refused["error"]["code"]) == (400, "service_tier", "invalid_value")
