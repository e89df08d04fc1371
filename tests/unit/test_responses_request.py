"""Responses request bodies → messages, tools and settings; the recorded codex and pi requests rendered
through the real Qwen3.5 template; the bounded store behind `previous_response_id`."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from looptrace.proxy.api.openai.chat.request import parse_chat
from looptrace.proxy.api.errors import APIError
from looptrace.proxy.api.request_parts import MEDIA_NOTE
from looptrace.proxy.api.openai.responses.store import ResponseStore
from looptrace.proxy.api.openai.responses.request import (
    Previous,
    parse_responses,
    to_messages,
)

import build_cache
import load_once

EXEC = {"type": "function", "name": "exec_command", "description": "Run a command.", "strict": False,
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}
PATCH = {"type": "custom", "name": "apply_patch", "description": "Edit files with a patch.",
         "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "*** Begin Patch" LF'}}
AGENTS = {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.", "tools": [
    {"type": "function", "name": "close_agent", "parameters": {"type": "object", "properties": {"target": {"type": "string"}}}},
    {"type": "function", "name": "spawn_agent", "parameters": {"type": "object", "properties": {}}},
]}


def user(text):
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def parse(**body):
    body.setdefault("model", "m")
    body.setdefault("input", "hi")
    return parse_responses(body)


def refused(**body) -> APIError:
    with pytest.raises(APIError) as info:
        parse(**body)
    return info.value


# -- input items --

def test_a_string_input_is_one_user_message_after_the_instructions():
    request, options, _ = parse(input="Hello", instructions="Be brief.")
    assert request.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    assert options.items == [{"type": "message", "role": "user", "content": "Hello"}]


def test_leading_developer_messages_join_the_instructions_in_one_system_message():
    # codex sends two developer messages first; templates read the system prompt from messages[0] only.
    items = [{"type": "message", "id": "msg_1", "role": "developer", "content": [{"type": "input_text", "text": "A"}]},
             {"type": "message", "id": "msg_2", "role": "developer", "content": [{"type": "input_text", "text": "B"},
                                                                                  {"type": "input_text", "text": "C"}]},
             user("Q"),
             {"role": "developer", "content": "later"}]
    assert to_messages(as_items(items), "I", _names()) == [
        {"role": "system", "content": "I\n\nA\n\nB\nC"},
        {"role": "user", "content": "Q"},
        {"role": "system", "content": "later"},  # past the start: left where it is, for the template to judge
    ]


def parse_response_tools(tools: list):
    """Tools as a request offers them: the functions the model sees, and the name map."""
    request, _, names = parse(tools=tools)
    return request.tools, names


def _names():
    return parse_response_tools([EXEC, PATCH, AGENTS])[1]


def as_items(items: list) -> list:
    return Previous.of(items).items


def test_a_tool_loop_becomes_assistant_turns_and_tool_messages():
    items = [
        user("Run it"),
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Plan."}],
         "encrypted_content": "opaque"},
        {"type": "function_call", "id": "fc_1", "status": "completed", "call_id": "c1", "name": "exec_command",
         "arguments": '{"cmd": "echo a"}'},
        {"type": "function_call", "id": "fc_2", "call_id": "c2", "name": "close_agent", "namespace": "multi_agent_v1",
         "arguments": '{"target": "x"}'},
        {"type": "function_call_output", "id": "fco_1", "call_id": "c1", "output": "a\n"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "closed"}]},
        {"type": "custom_tool_call", "id": "ctc_1", "call_id": "c3", "name": "apply_patch", "input": "*** Begin Patch"},
        {"type": "custom_tool_call_output", "call_id": "c3", "output": "Success."},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Summary only."}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]},
    ]
    assert to_messages(as_items(items), None, _names()) == [
        {"role": "user", "content": "Run it"},
        {"role": "assistant", "content": "", "reasoning_content": "Plan.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "exec_command", "arguments": {"cmd": "echo a"}}},
            {"id": "c2", "type": "function", "function": {"name": "multi_agent_v1.close_agent",
                                                          "arguments": {"target": "x"}}},
        ]},
        {"role": "tool", "content": "a\n", "tool_call_id": "c1", "name": "exec_command"},
        {"role": "tool", "content": "closed", "tool_call_id": "c2", "name": "multi_agent_v1.close_agent"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c3", "type": "function", "function": {"name": "apply_patch",
                                                          "arguments": {"input": "*** Begin Patch"}}}]},
        {"role": "tool", "content": "Success.", "tool_call_id": "c3", "name": "apply_patch"},
        {"role": "assistant", "content": "Done.", "reasoning_content": "Summary only."},
    ]


def test_text_then_calls_is_one_turn_and_a_reasoning_after_calls_starts_another():
    items = [user("Q"),
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
             {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": "{}"},
             {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Again."}]},
             {"type": "function_call", "call_id": "c2", "name": "exec_command", "arguments": ""}]
    turns = [m for m in to_messages(as_items(items), None, _names()) if m["role"] == "assistant"]
    assert [(t["content"], t.get("reasoning_content"), [c["id"] for c in t["tool_calls"]]) for t in turns] == [
        ("Let me look.", None, ["c1"]), ("", "Again.", ["c2"])]
    assert turns[1]["tool_calls"][0]["function"]["arguments"] == {}  # empty arguments: no arguments


def test_unknown_items_are_replayed_when_they_carry_text_else_skipped_with_a_warning(caplog):
    items = [user("Q"), {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search"}},
             {"type": "compaction_note", "text": "Earlier work was summarised."}]
    with caplog.at_level(logging.WARNING, logger="looptrace"):
        messages = to_messages(as_items(items), None, _names())
    assert messages == [{"role": "user", "content": "Q"}, {"role": "user", "content": "Earlier work was summarised."}]
    assert "skipping input item 1 of type 'web_search_call'" in caplog.text


def test_an_image_in_a_user_message_or_a_tool_output_is_a_part_and_elsewhere_a_note():
    image = {"type": "input_image", "image_url": "data:image/png;base64,AA"}
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is this?"}, image]}
    (message,) = to_messages(as_items([item]), None, _names())
    text, part = message["content"]
    assert text == {"type": "text", "text": "What is this?"}
    assert (part["type"], part["media"].kind, part["media"].mime, part["media"].encoded) == ("image", "image", "image/png", "AA")
    assert part["media"].param == "input[0].content[1].image_url"
    output = {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_text", "text": "shot:"}, image]}
    text, part = to_messages(as_items([output]), None, _names())[-1]["content"]
    assert text == {"type": "text", "text": "shot:"} and part["media"].param == "input[0].output[1].image_url"
    system = {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Rules."}, image]}
    assert to_messages(as_items([system, item]), None, _names())[0]["content"] == f"Rules.\n{MEDIA_NOTE}"


def test_bad_items_are_refused_with_the_offending_field():
    err = refused(input=[user("Q"), {"type": "function_call", "call_id": "c", "name": "x", "arguments": "{oops"}])
    assert (err.status, err.param) == (400, "input[1].arguments") and "not valid JSON" in err.message
    err = refused(input=[{"type": "message", "role": "tool", "content": "x"}])
    assert err.param == "input[0].role"
    err = refused(input=[user("Q"), {"type": "function_call_output", "output": "x"}])
    assert (err.param, err.code) == ("input[1].call_id", "missing_required_parameter")
    err = refused(input=[{"type": "message", "role": "user", "content": [{"type": "input_hologram"}]}])
    assert err.param == "input[0].content[0].type"
    assert refused(input=42).param == "input"
    assert refused(input=["text"]).param == "input[0]"
    assert refused(input=[]).code == "missing_required_parameter"


# -- tools --

def test_custom_and_namespace_tools_are_offered_as_functions():
    tools, names = parse_response_tools([EXEC, PATCH, AGENTS, {"type": "web_search", "external_web_access": False},
                                         {"type": "tool_search"}])
    assert [t["function"]["name"] for t in tools] == [
        "exec_command", "apply_patch", "multi_agent_v1.close_agent", "multi_agent_v1.spawn_agent"]
    assert tools[0] == {"type": "function", "function": {"name": "exec_command", "description": "Run a command.",
                                                         "parameters": EXEC["parameters"]}}
    patch = tools[1]["function"]
    assert patch["description"] == "Edit files with a patch."
    assert patch["parameters"]["required"] == ["input"]
    assert patch["parameters"]["properties"]["input"]["type"] == "string"
    assert 'start: "*** Begin Patch" LF' in patch["parameters"]["properties"]["input"]["description"]
    assert names.resolve("apply_patch").kind == "custom"
    close = names.resolve("multi_agent_v1.close_agent")
    assert (close.kind, close.name, close.namespace) == ("function", "close_agent", "multi_agent_v1")
    assert names.resolve("multi_agent_v1::close_agent") == close  # the separator some models write
    assert names.resolve("close_agent") == close  # a bare name that is unique
    assert names.resolve("nope") is None


def test_an_ambiguous_bare_name_resolves_to_nothing():
    other = {"type": "namespace", "name": "other", "tools": [{"type": "function", "name": "close_agent"}]}
    _, names = parse_response_tools([AGENTS, other])
    assert names.resolve("close_agent") is None
    assert names.resolve("other.close_agent").namespace == "other"


def test_unusable_tools_are_dropped_with_one_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="looptrace"):
        tools, _ = parse_response_tools([{"type": "image_generation_unusable_here"}])
        parse_response_tools([{"type": "image_generation_unusable_here"}])
    assert tools is None
    assert caplog.text.count("dropping image_generation_unusable_here tools") == 1


def test_tool_errors_name_the_field():
    with pytest.raises(APIError) as info:
        parse_response_tools([EXEC, EXEC])
    assert info.value.param == "tools[1].name" and "Duplicate" in info.value.message
    with pytest.raises(APIError) as info:
        parse_response_tools([{"type": "namespace", "name": "n", "tools": [{"type": "function"}]}])
    assert info.value.param == "tools[0].tools[0].name"
    with pytest.raises(APIError) as info:
        parse_response_tools([{"type": "function", "name": "f", "parameters": "none"}])
    assert info.value.param == "tools[0].parameters"


def test_tool_choice_forms():
    tools = [EXEC, PATCH, AGENTS, {"type": "web_search"}]
    assert parse(tools=tools)[0].tool_choice == "auto"
    assert parse(tools=tools, tool_choice="required")[0].tool_choice == "required"
    assert parse(tools=tools, tool_choice={"type": "custom", "name": "apply_patch"})[0].tool_choice == {"name": "apply_patch"}
    choice = {"type": "function", "name": "close_agent", "namespace": "multi_agent_v1"}
    assert parse(tools=tools, tool_choice=choice)[0].tool_choice == {"name": "multi_agent_v1.close_agent"}
    assert parse(tools=tools, tool_choice={"type": "allowed_tools", "mode": "required", "tools": []})[0].tool_choice == "required"
    assert parse(tools=tools, tool_choice={"type": "web_search"})[0].tool_choice == "auto"
    assert parse(tools=[{"type": "web_search"}], tool_choice="required")[0].tool_choice == "auto"
    assert refused(tools=tools, tool_choice={"type": "function", "name": "missing"}).param == "tool_choice"


# -- settings --

def test_settings_map_onto_the_generation_request():
    request, options, _ = parse(max_output_tokens=64, temperature=0.2, top_p=0.5, reasoning={"effort": "none"},
                                parallel_tool_calls=False, store=False, stream=True, text={"format": {"type": "text"}},
                                prompt_cache_key="k", include=["reasoning.encrypted_content"], client_metadata={"a": "b"})
    assert (request.max_tokens, request.max_tokens_param) == (64, "max_output_tokens")
    assert (request.temperature, request.top_p, request.parallel_tool_calls) == (0.2, 0.5, False)
    assert request.enable_thinking is False
    assert (options.store, options.stream) == (False, True)
    assert parse(reasoning={"effort": "high"})[0].enable_thinking is True
    assert parse(reasoning={"summary": "auto"})[0].enable_thinking is None  # the template's own default
    assert parse()[1].store is True  # OpenAI's default


def test_setting_errors_name_the_field():
    assert refused(max_output_tokens=0).param == "max_output_tokens"
    assert refused(temperature=3).param == "temperature"
    assert refused(top_p=0).param == "top_p"
    assert refused(reasoning={"effort": 1}).param == "reasoning.effort"
    assert refused(text={"format": "json"}).param == "text.format"
    assert refused(model=3).param == "model"
    # No model is not refused here: the route fills it in (default_model.py; test_codex_requests.py).
    assert parse(model=None)[1].model is None


def test_a_previous_conversation_comes_first():
    previous = [user("Q"), {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": "{}"}]
    body = {"model": "m", "input": [{"type": "function_call_output", "call_id": "c1", "output": "ok"}], "tools": [EXEC]}
    request, options, _ = parse_responses(body, previous)
    assert [m["role"] for m in request.messages] == ["user", "assistant", "tool"]
    assert request.messages[2]["name"] == "exec_command"
    assert options.items == previous + body["input"]


# -- the store --

def test_the_store_keeps_the_newest_conversations_only():
    asyncio.run(newest_conversations_only(ResponseStore(max_responses=2)))


async def newest_conversations_only(store) -> None:
    """Shared with the store-backed version (test_shared_state.py): the same bounds, the same answers."""
    reply = {"type": "message", "role": "assistant", "content": []}
    await store.put({"id": "resp_a", "output": [reply]}, [user("1")])
    await store.put({"id": "resp_b", "output": [reply]}, [user("2")])
    await store.put({"id": "resp_c", "output": []}, [user("3")])
    assert len(store) == 2
    assert await store.conversation("resp_b") == [user("2"), reply]
    assert await store.response("resp_c") == {"id": "resp_c", "output": []}
    with pytest.raises(APIError) as info:
        await store.conversation("resp_a")
    assert (info.value.status, info.value.code, info.value.param) == (
        404, "previous_response_not_found", "previous_response_id")
    await store.delete("resp_c")
    with pytest.raises(APIError) as info:
        await store.response("resp_c")
    assert (info.value.status, info.value.code) == (404, "response_not_found")


def test_the_store_is_bounded_by_bytes_too():
    asyncio.run(bounded_by_bytes(ResponseStore(max_responses=256, max_bytes=5 << 20)))


async def bounded_by_bytes(store) -> None:
    # 300 responses to requests carrying a 1 MiB field once held 241 MiB.
    for i in range(300):
        await store.put({"id": f"resp_{i}", "output": []}, [{**user(str(i)), "unused": "x" * (1 << 20)}])
        assert store.held_bytes <= 5 << 20
    assert len(store) == 4 and (await store.response("resp_299"))["id"] == "resp_299"
    await store.put({"id": "resp_huge", "output": []}, [user("y" * (6 << 20))])  # larger than the bound: not kept
    with pytest.raises(APIError):
        await store.response("resp_huge")
    assert len(store) == 4
    before = store.held_bytes
    await store.delete("resp_299")
    assert store.held_bytes < before - (1 << 20)


# -- what the real clients sent, rendered by the real template --

def _recorded(name):
    try:
        path = build_cache.shared_dir() / "clients" / "recorded" / name
    except build_cache.MissingShared as exc:
        pytest.skip(str(exc))
    return json.loads(path.read_text())["body"]


@pytest.fixture(scope="module")
def qwen(qwen3_5_dir):

    from looptrace.families import Qwen3_5

    return Qwen3_5(load_once.tokenizer(qwen3_5_dir))


@pytest.mark.parametrize("name", ["codex-first-request.json", "codex-after-tool-call.json"])
def test_recorded_codex_requests_render(qwen, name):
    body = _recorded(name)
    request, options, names = parse_responses(body)
    assert options.stream is True and options.store is False
    rendered = qwen.render(request.messages, request.tools, request.enable_thinking)
    text = rendered.text
    assert text.count("<|im_start|>system\n") == 1  # codex's developer messages, merged
    assert "You are a coding agent running in the Codex CLI" in text and "<skills_instructions>" in text
    assert '"name": "exec_command"' in text and '"name": "multi_agent_v1.close_agent"' in text
    assert '"web_search"' not in text  # dropped, not offered
    assert text.endswith("<|im_start|>assistant\n<think>\n")
    if name == "codex-after-tool-call.json":
        assert "<function=exec_command>\n<parameter=cmd>\necho hi\n</parameter>\n<parameter=yield_time_ms>\n1000\n" in text
        assert "<tool_response>\nChunk ID: 8e6d54\n" in text and "Output:\nhi\n</tool_response>" in text  # the template trims


@pytest.mark.parametrize("name", ["pi-chat-first-request.json", "pi-chat-after-tool-call.json"])
def test_recorded_pi_requests_render(qwen, name):
    request, _ = parse_chat(_recorded(name))
    text = qwen.render(request.messages, request.tools, request.enable_thinking).text
    assert "You are an expert coding assistant operating inside pi" in text and '"name": "read"' in text
    if name == "pi-chat-after-tool-call.json":
        assert "<tool_response>\nhello from a file\n</tool_response>" in text
