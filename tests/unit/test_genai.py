"""The server span in the OpenTelemetry GenAI conventions' content attributes, checked against the
conventions' own models (opentelemetry-util-genai, from the OpenTelemetry project) and names
(opentelemetry-semantic-conventions), so that GenAI tools show a request as its messages."""

from __future__ import annotations

import json
import typing
from dataclasses import asdict

import pytest
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as names
from opentelemetry.util.genai import types as conventions

from looptrace.proxy.settings import Settings

from app_thread import AppThread

CALL = ("Reading it.\n</think>\n\nOne moment.\n<tool_call>\n<function=read_file>\n<parameter=path>\nsrc/app.py\n"
        "</parameter>\n</function>\n</tool_call><|im_end|>")
TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file.", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
         {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}]
HISTORY = [
    {"role": "system", "content": "You read code."},
    {"role": "user", "content": "Look at the app."},
    {"role": "assistant", "content": "Sure.", "reasoning_content": "They want the app.",
     "tool_calls": [{"id": "call_a", "type": "function", "function": {"name": "now", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "call_a", "content": "12:00"},
    {"role": "user", "content": "And src/app.py?"},
]
PARTS = {"text": conventions.TextPart, "reasoning": conventions.ReasoningPart,
         "tool_call": conventions.ToolCallRequestPart, "tool_call_response": conventions.ToolCallResponsePart}


def conforming(cls, value: dict) -> dict:
    """`value` built as the conventions' model (an unknown or missing field is a TypeError), and back."""
    if cls in (conventions.InputMessage, conventions.OutputMessage):
        value = {**value, "parts": [conforming(PARTS[p["type"]], p) for p in value["parts"]]}
    rebuilt = asdict(cls(**value))
    return {k: v for k, v in rebuilt.items() if v is not None or k in value}


def root_of(app: AppThread, session: str) -> dict:
    trace_id = app.stored(f"/v1/sessions/{session}")["steps"][-1]["trace_id"]
    trace = app.stored(f"/v1/traces/{trace_id}")
    return next(s for s in trace["spans"] if s["parent_span_id"] is None)["attributes"]


def test_the_server_span_carries_the_conversation_in_the_conventions_shape(replay_app):
    replay_app.replay(CALL)
    status, answer = replay_app.call("POST", "/v1/chat/completions", {"model": "tiny-qwen", "messages": HISTORY,
                                                                       "tools": TOOLS}, {"session_id": "genai"})
    assert status == 200, answer
    attributes = root_of(replay_app, "genai")
    assert {names.GEN_AI_INPUT_MESSAGES, names.GEN_AI_OUTPUT_MESSAGES, names.GEN_AI_SYSTEM_INSTRUCTIONS,
            names.GEN_AI_TOOL_DEFINITIONS, names.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS} <= attributes.keys()

    instructions = json.loads(attributes[names.GEN_AI_SYSTEM_INSTRUCTIONS])
    assert [conforming(conventions.TextPart, p) for p in instructions] == instructions
    assert instructions == [{"type": "text", "content": "You read code."}]

    inputs = json.loads(attributes[names.GEN_AI_INPUT_MESSAGES])
    assert [conforming(conventions.InputMessage, m) for m in inputs] == inputs
    assert [m["role"] for m in inputs] == ["user", "assistant", "tool", "user"]
    assert inputs[1]["parts"] == [
        {"type": "reasoning", "content": "They want the app."}, {"type": "text", "content": "Sure."},
        {"type": "tool_call", "id": "call_a", "name": "now", "arguments": {}}]
    assert inputs[2]["parts"] == [{"type": "tool_call_response", "id": "call_a", "response": "12:00"}]

    (output,) = json.loads(attributes[names.GEN_AI_OUTPUT_MESSAGES])
    assert conforming(conventions.OutputMessage, output) == output
    assert output["finish_reason"] == "tool_call" and output["finish_reason"] in typing.get_args(conventions.FinishReason)
    message = answer["choices"][0]["message"]  # the answer as recorded is the answer the client got
    call = message["tool_calls"][0]
    assert output["parts"] == [
        {"type": "reasoning", "content": message["reasoning_content"]}, {"type": "text", "content": message["content"]},
        {"type": "tool_call", "id": call["id"], "name": "read_file", "arguments": {"path": "src/app.py"}}]
    assert message["reasoning_content"] == "Reading it." and message["content"].strip() == "One moment."

    definitions = json.loads(attributes[names.GEN_AI_TOOL_DEFINITIONS])
    assert [conforming(conventions.FunctionToolDefinition, d) for d in definitions] == definitions
    assert [d["name"] for d in definitions] == ["read_file", "now"] and definitions[1]["description"] is None
    assert attributes[names.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 0
    assert attributes[names.GEN_AI_OPERATION_NAME] == "chat"


def test_without_content_the_messages_stay_out(qwen3_5_dir, tmp_path):
    replay = tmp_path / "steps.jsonl"
    replay.write_text(json.dumps({"text": CALL}) + "\n")
    app = AppThread(Settings(model=str(qwen3_5_dir), backend="replay", replay=str(replay), served_model_name="tiny-qwen",
                             trace_content=False, trace_db=str(tmp_path / "t.sqlite3"))).start()
    try:
        status, _ = app.call("POST", "/v1/chat/completions", {"model": "tiny-qwen", "messages": HISTORY, "tools": TOOLS},
                             {"session_id": "bare"})
        assert status == 200
        attributes = root_of(app, "bare")
        for name in (names.GEN_AI_INPUT_MESSAGES, names.GEN_AI_OUTPUT_MESSAGES, names.GEN_AI_SYSTEM_INSTRUCTIONS,
                     names.GEN_AI_TOOL_DEFINITIONS, "looptrace.input.new_messages"):
            assert name not in attributes, name
        assert attributes[names.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 0  # numbers stay
        step = app.stored("/v1/sessions/bare")["steps"][0]
        assert "new_messages" not in step and "output" not in step and step["output_tokens"] > 0
    finally:
        app.stop()


@pytest.mark.parametrize("control", ["<|im_start|>", "<|im_end|>"])
def test_messages_are_recorded_as_sent(replay_app, control):
    # What a client sent is recorded verbatim in the attributes (escaping is the page's job, not the trace's).
    replay_app.replay("Ok.<|im_end|>")
    text = f"a{control}system\nb"
    status, _ = replay_app.call("POST", "/v1/chat/completions", {"model": "tiny-qwen", "messages": [
        {"role": "user", "content": text}]}, {"session_id": f"verbatim-{control}"})
    assert status == 200
    inputs = json.loads(root_of(replay_app, f"verbatim-{control}")[names.GEN_AI_INPUT_MESSAGES])
    assert inputs == [{"role": "user", "parts": [{"type": "text", "content": text}]}]
