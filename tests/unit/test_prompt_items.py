"""The items a conversation holds, counted before rendering (families/prompt_items.py, issue 31): each
kind refused past its limit, in one walk, and each item's least cost in tokens, measured on the
family's own template, a lower bound that never refuses a prompt that fits, for every family."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import HealthCheck, assume, given, settings

from looptrace.families import FAMILIES, RenderError, family_for_config
from looptrace.families.prompt_items import ITEM_LIMITS, ItemCounts, TooManyItems

import load_once
import many_items

CHECKPOINTS = {"gemma4": "gemma4_dir", "qwen3_5": "qwen3_5_dir", "chatml": "smollm2_gguf_path"}
_FAMILIES: dict = {}


@pytest.fixture(params=[f.name for f in FAMILIES])
def family(request):
    """Each family built from its test checkpoint, once per session."""
    name = request.param
    if name not in _FAMILIES:
        checkpoint = load_once.checkpoint(request.getfixturevalue(CHECKPOINTS[name]))
        tokenizer = load_once.tokenizer(checkpoint.folder, **checkpoint.load_kwargs())
        _FAMILIES[name] = family_for_config(checkpoint.config)(tokenizer)
    return _FAMILIES[name]


@settings(max_examples=30, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
@given(conversation=many_items.conversation())
def test_the_bound_never_refuses_a_prompt_that_fits(family, conversation):
    messages, tools = conversation
    try:
        actual = len(family.render(messages, tools).ids)
    except RenderError:
        assume(False)  # a shape this template refuses (Qwen3.5: a tool result with no call before it)
    assert family.tokens_beyond(messages, actual, tools) == 0
    for limit in (actual - 1, actual * 3 // 4, actual // 2, actual // 4):
        found = family.tokens_beyond(messages, limit, tools)
        assert found == 0 or limit < found <= actual, (limit, found, actual)


def test_each_item_costs_what_its_template_writes(family):
    # Not zero where the template writes something for each: a run of many small items that cannot
    # fit is found without rendering it.
    ask = {"role": "user", "content": "a"}
    many = [ask] * 300
    actual = len(family.render(many).ids)
    assert family.tokens_beyond(many, actual // 2) > actual // 2
    calls = [ask, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": {"k": 1}}}] * 200}, ask]
    actual = len(family.render(calls).ids)
    if actual > 200:  # the template writes past calls (SmolLM2's leaves them out)
        assert family.tokens_beyond(calls, actual // 3) > actual // 3


@pytest.mark.parametrize("kind", list(ITEM_LIMITS))
def test_past_a_kinds_limit_the_walk_stops_and_names_it(kind):
    limit, param = ITEM_LIMITS[kind]
    ask = {"role": "user", "content": "a"}
    n = 4 * limit  # the walk stops at the limit: what follows is never looked at
    messages, tools = [ask], None
    if kind == "messages":
        messages = [ask] * n
    elif kind == "content parts":
        messages = [{"role": "user", "content": [{"type": "text", "text": "a"}] * n}]
    elif kind == "tools":
        tools = [{"type": "function", "function": {"name": "f"}}] * n
    elif kind == "keys in tool definitions":
        tools = [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {f"p{i}": {} for i in range(n)}}}}]
    elif kind == "past tool calls":
        messages = [ask, {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {}}}] * n}]
    else:
        messages = [ask, {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {
            "outer": [{f"k{i}": 1 for i in range(n)}]}}}]}]  # at any depth
    started = time.perf_counter()
    with pytest.raises(TooManyItems) as refused:
        ItemCounts(messages, tools)
    assert (refused.value.kind, refused.value.param) == (kind, param)
    assert f"more than {limit:,} {kind}" in str(refused.value)
    assert time.perf_counter() - started < 1.0


def test_a_conversation_at_every_limit_is_counted():
    ask = {"role": "user", "content": "a"}
    call = {"function": {"name": "f", "arguments": {"k": 1}}}
    messages = [ask] * (ITEM_LIMITS["messages"][0] - 1) + [{"role": "assistant", "tool_calls": [call] * 100}]
    counts = ItemCounts(messages, [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {}, "b": {}}}}}])
    assert counts.roles == {"system": 0, "user": ITEM_LIMITS["messages"][0] - 1, "assistant": 1, "tool": 0}
    assert (counts.kinds["past tool calls"], counts.arguments, counts.properties) == (100, 100, 2)
    assert json.dumps(counts.kinds)  # plain counts, for the trace or a log
