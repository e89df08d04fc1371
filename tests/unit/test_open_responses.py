"""The Open Responses compliance suite (support/open_responses.py, a port of the specification's own
`compliance-tests.ts`) against looptrace: 10 of 10 on a model that reads images (the tiny Qwen3.5,
with its image processor: tiny_media.py), every test but image-input on a text-only one (the same
checkpoint without it: the `replay_app`), where image-input is refused as the model cannot read it.

The replay backend scripts what the model writes (the suite asks a real model for a greeting, a tool
call, a title; a random-weight one writes none of them), so the answers are recorded in the suite's
order; everything between the request and the answer (parsing, rendering with the real template, the
PDF read, tokenizing, the image through the processor, the stream, previous_response_id from the store)
is the server's own.
"""

from __future__ import annotations

import pytest

import open_responses
from open_responses_schema import EVENT, RESPONSE, issues

from .test_responses import call

MODEL = "tiny-qwen"
TEXT = "\n</think>\n\nHello from looptrace.<|im_end|>"
WEATHER_CALL = "\n</think>\n\n" + call("get_weather", location="San Francisco, CA") + "<|im_end|>"
# The answers, in the order the suite's requests come (function-call-roundtrip and
# previous-response-id send two requests each).
ANSWERS = {
    "basic-response": [TEXT], "streaming-response": [TEXT], "system-prompt": [TEXT],
    "tool-calling": [WEATHER_CALL], "tool-calling-streaming": [WEATHER_CALL],
    "function-call-roundtrip": [WEATHER_CALL, TEXT], "image-input": [TEXT], "file-input": [TEXT],
    "multi-turn": [TEXT], "previous-response-id": [TEXT, TEXT],
}


def run(app, tests: list[str]) -> dict[str, open_responses.Result]:
    app.replay(*(answer for test in tests for answer in ANSWERS[test]))
    return {r.id: r for r in open_responses.run_all(app.url + "/v1", MODEL, tests)}


def test_the_port_holds_the_suites_ten_tests():
    assert list(open_responses.TESTS) == list(ANSWERS) and len(ANSWERS) == 10


def test_open_responses_compliance_on_a_model_that_reads_images(images_app):
    results = run(images_app, list(ANSWERS))
    failed = {k: r.errors for k, r in results.items() if r.status != "passed"}
    assert not failed, failed
    assert sum(r.status == "passed" for r in results.values()) == 10
    # What the suite saw came from the model: the call's arguments, and a stream of many events.
    (called,) = [i for i in results["tool-calling"].responses[0]["output"] if i["type"] == "function_call"]
    assert called["name"] == "get_weather" and "San Francisco" in called["arguments"]
    assert len(results["tool-calling-streaming"].events) > 6


@pytest.fixture(scope="module")
def images_app(qwen3_5_dir, tmp_path_factory):
    """The tiny Qwen3.5 with its image and video processors' configs (tiny_media.py): it reads images."""
    from looptrace.proxy.settings import Settings

    from app_thread import AppThread
    from tiny_media import with_images

    folder = tmp_path_factory.mktemp("images")
    placeholder = folder / "none.jsonl"
    placeholder.write_text('{"text": "unused"}\n')
    app = AppThread(Settings(model=str(with_images(qwen3_5_dir, "qwen3_5")), backend="replay", replay=str(placeholder),
                             served_model_name=MODEL, trace_db=str(folder / "traces.sqlite3"))).start()
    yield app
    app.stop()


def test_open_responses_compliance_on_a_text_only_model(replay_app):
    tests = [t for t in ANSWERS if t != "image-input"]
    results = run(replay_app, tests)
    failed = {k: r.errors for k, r in results.items() if r.status != "passed"}
    assert not failed, failed
    # The image test fails there for the one reason it should: the model cannot read images.
    (image,) = open_responses.run_all(replay_app.url + "/v1", MODEL, ["image-input"])
    assert image.status == "failed" and "HTTP 400" in image.errors[0] and "media_unsupported" in image.errors[0]


def test_the_schema_port_refuses_what_the_specification_refuses(replay_app):
    """The checks can fail: a response lacking a required field, a null where none is allowed, a
    string for a number, an event of a type outside the union."""
    replay_app.replay(TEXT)
    (result,) = open_responses.run_all(replay_app.url + "/v1", MODEL, ["basic-response"])
    response = result.responses[0]
    assert issues(RESPONSE, response) == []
    for broken in ({k: v for k, v in response.items() if k != "completed_at"}, {**response, "temperature": None},
                   {**response, "top_logprobs": "0"}, {**response, "tools": [{"type": "function", "name": "f"}]}):
        assert issues(RESPONSE, broken)
    assert issues(EVENT, {"type": "response.reasoning_text.delta", "sequence_number": 1, "item_id": "rs_1",
                          "output_index": 0, "content_index": 0, "delta": "x"})
    assert open_responses.parse_sse(b'data: {"type": "response.created"}\n\ndata: [DONE]\n\n').errors
