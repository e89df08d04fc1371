"""OTLP export read back from a real receiver (Arize Phoenix): the same span tree, every token."""

from __future__ import annotations

import json
import time

import pytest
from openai import OpenAI

from looptrace.trace_store.tokens import expand_events

from phoenix import Phoenix

CALL = ("Checking.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call><|im_end|>")
LONG = " word" * 4000 + "<|im_end|>"
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}


@pytest.fixture(scope="module")
def exported(serve, qwen3_5_dir, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("phoenix")
    phoenix = Phoenix(workdir / "phoenix")
    try:
        phoenix.wait_ready()
        replay = workdir / "steps.jsonl"
        replay.write_text(json.dumps({"text": CALL}) + "\n" + json.dumps({"text": LONG}) + "\n")
        server = serve(str(qwen3_5_dir), "--backend", "replay", "--replay", str(replay), "--served-model-name", "qwen",
                       "--otlp-endpoint", phoenix.url)
        client = OpenAI(base_url=server.base_url, api_key="unused")
        ask = [{"role": "user", "content": "Weather?"}]
        call = client.chat.completions.create(model="qwen", messages=ask, tools=[WEATHER])
        long = client.chat.completions.create(model="qwen", messages=ask, max_tokens=5000,
                                              extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        traces = server.get("/v1/traces")[1]["data"]
        while len(traces) < 2:
            time.sleep(0.2)
            traces = server.get("/v1/traces")[1]["data"]
        yield phoenix, server, call, long, [t["trace_id"] for t in reversed(traces)]
    finally:
        phoenix.stop()


def received(phoenix, trace_id, count, timeout=60):
    deadline = time.monotonic() + timeout
    spans = []
    while time.monotonic() < deadline:
        spans = phoenix.spans(trace_id)
        if len(spans) >= count:
            return spans
        time.sleep(0.5)
    return spans


def test_the_span_tree_arrives_whole(exported):
    phoenix, server, call, long, (call_trace, _) = exported
    stored = {s["name"]: s for s in server.get(f"/v1/traces/{call_trace}")[1]["spans"]}
    spans = {s["name"]: s for s in received(phoenix, call_trace, len(stored))}
    assert set(spans) == set(stored) == {"chat qwen", "render", "prefill", "decode", "execute_tool get_weather"}
    root_id = spans["chat qwen"]["context"]["span_id"]
    assert spans["chat qwen"]["parent_id"] is None
    assert all(s["parent_id"] == root_id for n, s in spans.items() if n != "chat qwen")
    for name, span in spans.items():
        assert span["context"]["span_id"] == stored[name]["span_id"]
        # Phoenix adds a few derived keys of its own (llm.finish_reason); ours must all arrive unchanged.
        assert {k: span["attributes"].get(k) for k in stored[name]["attributes"]} == stored[name]["attributes"]
    tool = spans["execute_tool get_weather"]["attributes"]
    assert tool["gen_ai.tool.call.id"] == call.choices[0].message.tool_calls[0].id
    tokens = expand_events(spans["decode"]["events"])
    assert len(tokens) == call.usage.completion_tokens
    assert "".join(t["text"] for t in tokens) == CALL.removesuffix("<|im_end|>")


def test_every_token_of_a_long_answer_arrives(exported):
    phoenix, server, call, long, (_, long_trace) = exported
    spans = {s["name"]: s for s in received(phoenix, long_trace, 4)}
    tokens = expand_events(spans["decode"]["events"])
    assert long.usage.completion_tokens >= 4000
    assert [t["index"] for t in tokens] == list(range(long.usage.completion_tokens))
    assert "".join(t["text"] for t in tokens) == LONG.removesuffix("<|im_end|>")


def test_phoenix_shows_a_request_as_an_llm_conversation(exported):
    """The GenAI content attributes (gen_ai.input.messages and the rest) are what GenAI tools read:
    Phoenix turns them into an LLM span with its input and output messages."""
    phoenix, server, call, long, (call_trace, _) = exported
    root = next(s for s in received(phoenix, call_trace, 5) if s["parent_id"] is None)
    assert root["span_kind"] == "LLM"
    attributes = root["attributes"]
    assert attributes["llm.model_name"] == "qwen"
    assert (attributes["llm.input_messages.0.message.role"], attributes["llm.input_messages.0.message.content"]) == (
        "user", "Weather?")
    output = "llm.output_messages.0.message."
    assert attributes[output + "role"] == "assistant" and attributes[output + "finish_reason"] == "tool_call"
    made = call.choices[0].message.tool_calls[0]
    assert attributes[output + "tool_calls.0.tool_call.id"] == made.id
    assert attributes[output + "tool_calls.0.tool_call.function.name"] == "get_weather"
    assert json.loads(attributes[output + "tool_calls.0.tool_call.function.arguments"]) == {"city": "Paris", "days": 3}
    assert json.loads(attributes["llm.tools.0.tool.json_schema"])["function"]["name"] == "get_weather"
    assert attributes["llm.token_count.prompt"] == call.usage.prompt_tokens
    assert attributes["llm.token_count.completion"] == call.usage.completion_tokens
