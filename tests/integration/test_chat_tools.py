"""Tool calls through /v1/chat/completions, driven by the replay backend with each family's real format."""

from __future__ import annotations

import json

import pytest
from openai import OpenAI

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Forecast for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city", "days"]}}}
ASK = [{"role": "user", "content": "Weather in Paris for 3 days?"}]

QWEN_CALL = "<tool_call>\n<function=get_weather>\n<parameter=city>\n{city}\n</parameter>\n<parameter=days>\n{days}\n</parameter>\n</function>\n</tool_call>"
QWEN_STEPS = [
    # 1. thinking, then one call, then the stop token
    "I should look it up.\n</think>\n\n" + QWEN_CALL.format(city="Paris", days=3) + "<|im_end|>",
    # 2. two calls in one turn (streamed)
    "Two cities.\n</think>\n\n" + QWEN_CALL.format(city="Paris", days=3) + "\n"
    + QWEN_CALL.format(city="Lyon", days=1) + "<|im_end|>",
    # 3. an opener followed by nonsense: returned as text, never dropped
    "\n</think>\n\n<tool_call> is how I would call a tool<|im_end|>",
    # 4. cut off by max_tokens inside a call
    "\n</think>\n\n" + QWEN_CALL.format(city="Paris", days=3) + "<|im_end|>",
    # 5. tool_choice none: a call anyway comes back as text
    "\n</think>\n\n" + QWEN_CALL.format(city="Oslo", days=2) + "<|im_end|>",
    # 6. the answer after the tool result
    "It will be sunny.\n</think>\n\nSunny in Paris for three days.<|im_end|>",
]


def replay_file(tmp_path, steps):
    path = tmp_path / "steps.jsonl"
    path.write_text("".join(json.dumps({"text": s}) + "\n" for s in steps))
    return str(path)


@pytest.fixture(scope="module")
def qwen_replay(serve, qwen3_5_dir, tmp_path_factory):
    path = replay_file(tmp_path_factory.mktemp("replay"), QWEN_STEPS)
    return serve(str(qwen3_5_dir), "--backend", "replay", "--replay", path, "--served-model-name", "qwen")


def test_a_session_of_tool_calls(qwen_replay):
    client = OpenAI(base_url=qwen_replay.base_url, api_key="unused")

    # 1. one call, with the reasoning before it
    first = client.chat.completions.create(model="qwen", messages=ASK, tools=[WEATHER])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert choice.message.model_extra["reasoning_content"] == "I should look it up."
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 3}  # typed by the schema

    # 2. two calls, streamed: every fragment carries index, id, type and name
    chunks = list(client.chat.completions.create(model="qwen", messages=ASK, tools=[WEATHER], stream=True))
    fragments = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert [f.index for f in fragments] == [0, 1]
    assert all(f.id and f.type == "function" and f.function.name == "get_weather" for f in fragments)
    assert [json.loads(f.function.arguments) for f in fragments] == [{"city": "Paris", "days": 3},
                                                                     {"city": "Lyon", "days": 1}]
    assert len({f.id for f in fragments}) == 2
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]

    # 3. an unparseable call is text
    third = client.chat.completions.create(model="qwen", messages=ASK, tools=[WEATHER])
    assert third.choices[0].message.tool_calls is None
    assert third.choices[0].message.content == "<tool_call> is how I would call a tool"
    assert third.choices[0].finish_reason == "stop"

    # 4. a call cut off by max_tokens comes back as text, with finish_reason length
    fourth = client.chat.completions.create(model="qwen", messages=ASK, tools=[WEATHER], max_tokens=12)
    assert fourth.choices[0].finish_reason == "length"
    assert fourth.choices[0].message.tool_calls is None
    assert fourth.choices[0].message.content.startswith("<tool_call>\n<function=get_weather>")

    # 5. tool_choice none: no tool calls in the answer, whatever the model wrote
    fifth = client.chat.completions.create(model="qwen", messages=ASK, tools=[WEATHER], tool_choice="none")
    assert fifth.choices[0].message.tool_calls is None
    assert "<function=get_weather>" in fifth.choices[0].message.content
    assert fifth.choices[0].finish_reason == "stop"

    # 6. the tool result goes back in (arguments as a JSON string, as clients send them) and renders
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"forecast": "sunny"}'},
    ]
    answer = client.chat.completions.create(model="qwen", messages=history, tools=[WEATHER])
    assert answer.choices[0].message.content == "Sunny in Paris for three days."
    assert answer.choices[0].finish_reason == "stop"

    # 7. the replay is used up: a clear error, not a hang
    status, error = qwen_replay.post("/v1/chat/completions", {"model": "qwen", "messages": ASK})
    assert status == 503 and error["error"]["code"] == "replay_exhausted"
    assert "all 6 recorded steps were served" in error["error"]["message"]


GEMMA_STEPS = [
    '<|channel>thought\nLook it up.<channel|><|tool_call>call:get_weather{city:<|"|>Paris, "the city of light"<|"|>,days:3}'
    '<tool_call|><|tool_response>',
    'Sunny, {"as":"json"} and <|"|>quoted<|"|>.<turn|>',
]


@pytest.fixture(scope="module")
def gemma_replay(serve, gemma4_dir, tmp_path_factory):
    path = replay_file(tmp_path_factory.mktemp("replay-gemma"), GEMMA_STEPS)
    return serve(str(gemma4_dir), "--backend", "replay", "--replay", path, "--served-model-name", "gemma")


def test_gemma_calls_never_leak_the_string_delimiter(gemma_replay):
    client = OpenAI(base_url=gemma_replay.base_url, api_key="unused")
    chunks = list(client.chat.completions.create(model="gemma", messages=ASK, tools=[WEATHER], stream=True,
                                                 extra_body={"chat_template_kwargs": {"enable_thinking": True}}))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = "".join(d.model_extra.get("reasoning_content") or "" for d in deltas)
    assert reasoning == "Look it up."
    (call,) = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert json.loads(call.function.arguments) == {"city": 'Paris, "the city of light"', "days": 3}
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]

    answer = client.chat.completions.create(model="gemma", messages=ASK)
    assert answer.choices[0].message.content == 'Sunny, {"as":"json"} and "quoted".'
    assert '<|"|>' not in json.dumps(answer.model_dump())


@pytest.fixture(scope="module")
def keyed(serve, qwen3_5_dir, tmp_path_factory):
    path = replay_file(tmp_path_factory.mktemp("replay-key"), ["\n</think>\n\nHi.<|im_end|>"])
    return serve(str(qwen3_5_dir), "--backend", "replay", "--replay", path, "--served-model-name", "qwen",
                 api_key="s3cret")


def test_api_key(keyed):
    body = {"model": "qwen", "messages": ASK}
    status, error = keyed.post("/v1/chat/completions", body, headers={"Authorization": ""})
    assert status == 401 and error["error"]["code"] == "invalid_api_key"
    status, error = keyed.post("/v1/chat/completions", body, headers={"Authorization": "Bearer wrong"})
    assert status == 401 and "Incorrect API key" in error["error"]["message"]
    assert keyed.get("/v1/models", headers={"Authorization": "Bearer wrong"})[0] == 401
    assert keyed.get("/health", headers={"Authorization": ""})[0] == 200
    client = OpenAI(base_url=keyed.base_url, api_key="s3cret")
    assert client.chat.completions.create(model="qwen", messages=ASK).choices[0].message.content == "Hi."
