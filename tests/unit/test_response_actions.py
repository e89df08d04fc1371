"""The Responses API's other routes: POST /v1/responses/input_tokens, GET /v1/responses/{id}/input_items
and POST /v1/responses/{id}/cancel, each answer checked against the openai SDK's own types."""

from __future__ import annotations

import json
import threading

from openai.types.responses import Response, ResponseItemList
from openai.types.responses.input_token_count_response import InputTokenCountResponse

from waiting import wait_until

from .test_openai_types import STREAM_EVENT, strict
from .test_responses import sse
from .test_responses_websocket import Slow

MODEL = "tiny-qwen"
TEXT = "\n</think>\n\nDone.<|im_end|>"
TOOL = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}}}}


def test_input_tokens_counts_the_prompt_a_response_reads(replay_app):
    body = {"model": MODEL, "instructions": "Be brief.", "tools": [TOOL], "input": "Weather in Paris?"}
    status, counted = replay_app.call("POST", "/v1/responses/input_tokens", body)
    assert status == 200, counted
    strict(InputTokenCountResponse, counted)
    replay_app.replay(TEXT)
    status, answered = replay_app.call("POST", "/v1/responses", body)
    assert status == 200
    # The same prompt: rendered with the same template, tools and instructions.
    assert counted == {"object": "response.input_tokens", "input_tokens": answered["usage"]["input_tokens"]}
    status, refused = replay_app.call("POST", "/v1/responses/input_tokens", {**body, "model": "other"})
    assert status == 404 and refused["error"]["code"] == "model_not_found"


def test_input_items_lists_what_the_model_read(replay_app):
    replay_app.replay(TEXT, TEXT)
    status, first = replay_app.call("POST", "/v1/responses", {"model": MODEL, "input": "Hello."})
    assert status == 200
    status, second = replay_app.call("POST", "/v1/responses", {
        "model": MODEL, "previous_response_id": first["id"],
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "And then?"}]}]})
    assert status == 200
    status, listed = replay_app.call("GET", f"/v1/responses/{second['id']}/input_items?order=asc")
    assert status == 200, listed
    strict(ResponseItemList, listed)
    texts = [(i["role"], i["content"][0]["text"]) for i in listed["data"]]
    assert texts == [("user", "Hello."), ("assistant", "Done."), ("user", "And then?")]
    assert listed["first_id"] == listed["data"][0]["id"] and not listed["has_more"]
    # Paged, newest first by default; ids stay the same from one read to the next.
    status, page = replay_app.call("GET", f"/v1/responses/{second['id']}/input_items?limit=2")
    assert [i["id"] for i in page["data"]] == [i["id"] for i in reversed(listed["data"])][:2] and page["has_more"]
    status, rest = replay_app.call("GET", f"/v1/responses/{second['id']}/input_items?limit=2&after={page['last_id']}")
    assert [i["id"] for i in rest["data"]] == [listed["data"][0]["id"]] and not rest["has_more"]
    for query, param in (("limit=0", "limit"), ("order=up", "order"), ("after=msg_x", "after")):
        status, refused = replay_app.call("GET", f"/v1/responses/{second['id']}/input_items?{query}")
        assert status == 400 and refused["error"]["param"] == param, refused
    status, missing = replay_app.call("GET", "/v1/responses/resp_none/input_items")
    assert status == 404


def test_cancel_stops_a_running_response(replay_app):
    slow = Slow(replay_app.replay("\n</think>\n\n" + "word " * 400 + "<|im_end|>"))
    replay_app.runtime.backend = slow
    got: list = []
    streaming = threading.Thread(target=lambda: got.append(replay_app.post({"model": MODEL, "input": "x",
                                                                            "stream": True})), daemon=True)
    streaming.start()
    wait_until(lambda: slow.tokens >= 3, 60, every=0.02, what="the response under way")
    (response_id,) = _running_ids(replay_app)
    status, cancelled = replay_app.call("POST", f"/v1/responses/{response_id}/cancel")
    assert status == 200, cancelled
    strict(Response, cancelled)
    assert cancelled["id"] == response_id and cancelled["status"] == "cancelled"
    streaming.join(30)
    assert slow.closed.is_set() and slow.tokens < 400  # its generation stopped
    status, _, data = got[0]
    events = sse(data)
    for event in events:
        STREAM_EVENT.validate_python(event, strict=True)
    assert events[-1]["type"] == "response.failed" and events[-1]["response"]["status"] == "cancelled"
    # Once ended, it is not running: a second cancel says so, and a response never seen is a 404.
    status, again = replay_app.call("POST", f"/v1/responses/{response_id}/cancel")
    assert status == 404 and "--workers" in again["error"]["message"], again
    replay_app.replay(TEXT)
    status, done = replay_app.call("POST", "/v1/responses", {"model": MODEL, "input": "x"})
    status, refused = replay_app.call("POST", f"/v1/responses/{done['id']}/cancel")
    assert status == 400 and refused["error"]["code"] == "response_not_running", refused


def _running_ids(app) -> list[str]:
    from looptrace.proxy.api.openai.responses.running import RUNNING

    return list(app.app[RUNNING]._by_id)


def test_a_non_streamed_response_cancelled_answers_cancelled(replay_app):
    slow = Slow(replay_app.replay("\n</think>\n\n" + "word " * 400 + "<|im_end|>"))
    replay_app.runtime.backend = slow
    got: list = []
    waiting = threading.Thread(target=lambda: got.append(replay_app.call("POST", "/v1/responses", {
        "model": MODEL, "input": "x"})), daemon=True)
    waiting.start()
    wait_until(lambda: slow.tokens >= 3, 60, every=0.02, what="the response under way")
    (response_id,) = _running_ids(replay_app)
    assert replay_app.call("POST", f"/v1/responses/{response_id}/cancel")[0] == 200
    waiting.join(30)
    status, body = got[0]
    assert status == 200 and body["status"] == "cancelled", json.dumps(body)[:300]
    strict(Response, body)
