"""OTLP export read back from a real receiver, Arize Phoenix's own server: a three-turn tool-calling
session (Chat Completions, then Chat Completions streamed, then Responses streamed) arrives whole on
every turn, each tool call with its result, as Phoenix's LLM spans, session, trace list and session
view; every token of a long answer arrives; and a session in Claude Code's header shapes (main → a1 →
a2) shows as its agent tree, invoke_agent spans nested, beside each request's own trace. One Phoenix
for the module."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request

import pytest
from openai import OpenAI

from looptrace.common import attributes as attr
from looptrace.trace_store.tokens import expand_events

from browser import Page
from phoenix import Phoenix
from waiting import wait_until

CITY = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": CITY}},
         {"type": "function", "function": {"name": "get_time", "parameters": CITY}}]
CALLS = ["I need the weather first.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
         "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call><|im_end|>",
         "Now the time.\n</think>\n\n<tool_call>\n<function=get_time>\n<parameter=city>\nParis\n</parameter>\n"
         "</function>\n</tool_call><|im_end|>"]
ANSWER = "Both known.\n</think>\n\nSunny and 21 C in Paris all three days; it is noon there.<|im_end|>"
LONG = " word" * 4000 + "<|im_end|>"
QUESTION = "Weather and time in Paris?"
RESULTS = ["sunny, 21 C", "12:00"]
SESSION = "phoenix-session-1"
STEPS = {"render", "prefill", "decode"}
TREES = [{"chat qwen", "execute_tool get_weather", *STEPS}, {"chat qwen", "execute_tool get_time", *STEPS},
         {"responses qwen", *STEPS}]
# What the store keeps of a step as what it adds to the one before: never sent (trace_store/chains.py).
DELTAS = {attr.PROMPT_BASE_TRACE_ID, attr.PROMPT_BASE_TOKENS, attr.PROMPT_BASE_CHARS, attr.PROMPT_ADDED_IDS,
          attr.PROMPT_ADDED_TEXT, attr.PROMPT_NEW_CHARS, attr.INPUT_BASE_TRACE_ID, attr.INPUT_BASE_MESSAGES}


def streamed_call(stream) -> tuple[dict, dict]:
    """A streamed Chat Completion's one tool call (id, name, arguments) and its usage."""
    call, usage = {"arguments": ""}, None
    for chunk in stream:
        usage = chunk.usage or usage
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            call["id"], call["name"] = delta.id or call.get("id"), delta.function.name or call.get("name")
            call["arguments"] += delta.function.arguments or ""
    return call, usage.model_dump()


def conversation(client: OpenAI) -> list[dict]:
    """The three turns; each one's answer as the client saw it (usage, tool call, text)."""
    headers = {"session_id": SESSION}
    first = client.chat.completions.create(model="qwen", messages=[{"role": "user", "content": QUESTION}],
                                           tools=TOOLS, extra_headers=headers)
    call = first.choices[0].message.tool_calls[0]
    calls = [{"id": call.id, "name": call.function.name, "arguments": call.function.arguments}]
    history = [{"role": "user", "content": QUESTION},
               {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
               {"role": "tool", "tool_call_id": call.id, "content": RESULTS[0]}]
    second, usage = streamed_call(client.chat.completions.create(
        model="qwen", messages=history, tools=TOOLS, stream=True, stream_options={"include_usage": True},
        extra_headers=headers))
    calls.append(second)
    items = [{"role": "user", "content": QUESTION}]
    for made, result in zip(calls, RESULTS):
        items += [{"type": "function_call", "call_id": made["id"], "name": made["name"],
                   "arguments": made["arguments"]},
                  {"type": "function_call_output", "call_id": made["id"], "output": result}]
    tools = [{"type": "function", "name": t["function"]["name"], "parameters": CITY} for t in TOOLS]
    events = list(client.responses.create(model="qwen", input=items, tools=tools, stream=True, extra_headers=headers))
    third = next(e.response for e in events if e.type == "response.completed")
    return [{"usage": first.usage.model_dump(), "call": calls[0]}, {"usage": usage, "call": calls[1]},
            {"usage": third.usage.model_dump(), "text": third.output_text}]


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory):
    found = Phoenix(tmp_path_factory.mktemp("phoenix") / "phoenix")
    try:
        found.wait_ready()
        yield found
    finally:
        found.stop()


def replay_file(folder, answers: list[str]):
    replay = folder / "steps.jsonl"
    replay.write_text("".join(json.dumps({"text": s}) + "\n" for s in answers))
    return replay


@pytest.fixture(scope="module")
def exported(phoenix, serve, qwen3_5_dir, tmp_path_factory):
    replay = replay_file(tmp_path_factory.mktemp("replay"), [*CALLS, ANSWER, LONG])
    server = serve(str(qwen3_5_dir), "--backend", "replay", "--replay", str(replay), "--served-model-name", "qwen",
                   "--otlp-endpoint", phoenix.url)
    client = OpenAI(base_url=server.base_url, api_key="unused")
    turns = conversation(client)
    long = client.chat.completions.create(model="qwen", messages=[{"role": "user", "content": "Talk."}],
                                          max_tokens=5000,
                                          extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    traces = wait_until(lambda: found if len(found := server.get("/v1/traces")[1]["data"]) >= 4 else None, 60,
                        every=0.2, what="the four requests stored")
    trace_ids = [t["trace_id"] for t in reversed(traces)]
    for turn, trace_id in zip(turns, trace_ids):
        turn["trace_id"] = trace_id
    yield phoenix, server, turns, long, trace_ids[3]


# A session in Claude Code's header shapes: the main agent spawns a1 (Explore) with its Task tool, a1
# spawns a2, a2 reads a file and answers, then a1 and the main agent answer.
AGENT_SESSION = "phoenix-agents-1"
TASK = {"type": "function", "function": {"name": "Task", "parameters": {
    "type": "object", "properties": {"prompt": {"type": "string"}}, "required": ["prompt"]}}}
READ = {"type": "function", "function": {"name": "read_file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}
SAID = {"x-claude-code-session-id": AGENT_SESSION}
AGENTS = {"main": SAID, "a1": {**SAID, "x-claude-code-agent-id": "a1", "x-claude-code-agent-type": "Explore"},
          "a2": {**SAID, "x-claude-code-agent-id": "a2", "x-claude-code-parent-agent-id": "a1",
                 "x-claude-code-agent-type": "general-purpose"}}
TASKS = {"main": "Find the word, with a subagent.", "a1": "Explore the repository for the word.",
         "a2": "Read notes.txt."}


def qwen_call(name: str, parameter: str, value: str) -> str:
    return (f"On it.\n</think>\n\n<tool_call>\n<function={name}>\n<parameter={parameter}>\n{value}\n"
            "</parameter>\n</function>\n</tool_call><|im_end|>")


def said(text: str) -> str:
    return f"Done.\n</think>\n\n{text}<|im_end|>"


# (whose turn, the replayed answer): six requests, in the order the harness sends them.
AGENT_TURNS = [("main", qwen_call("Task", "prompt", TASKS["a1"])), ("a1", qwen_call("Task", "prompt", TASKS["a2"])),
               ("a2", qwen_call("read_file", "path", "notes.txt")), ("a2", said("It is in notes.txt.")),
               ("a1", said("notes.txt holds it.")), ("main", said("The word is in notes.txt."))]


def agent_conversation(client: OpenAI) -> None:
    """Each agent's own conversation; a Task call's result is the subagent's last answer."""
    messages = {name: [{"role": "user", "content": task}] for name, task in TASKS.items()}
    last: dict[str, str] = {}
    waiting: dict[str, str] = {}  # agent → its call's id, answered by the agent it spawned (or a file)
    child = {"main": "a1", "a1": "a2"}
    for name, _ in AGENT_TURNS:
        if name in waiting:
            messages[name].append({"role": "tool", "tool_call_id": waiting.pop(name),
                                   "content": last.get(child.get(name), "the word")})
        answer = client.chat.completions.create(model="qwen", messages=messages[name], tools=[TASK, READ],
                                                extra_headers=AGENTS[name]).choices[0].message
        calls = [c.model_dump() for c in answer.tool_calls or []]
        messages[name].append({"role": "assistant", "content": answer.content or "",
                               **({"tool_calls": calls} if calls else {})})
        if answer.tool_calls:
            waiting[name] = answer.tool_calls[0].id
        last[name] = answer.content or ""


@pytest.fixture(scope="module")
def agent_tree(phoenix, serve, qwen3_5_dir, tmp_path_factory):
    """The agent session through a server of its own, stopped once stored: its agent spans go at shutdown
    (else once each agent has been quiet a minute). The store's session record: its agents and steps."""
    replay = replay_file(tmp_path_factory.mktemp("agents"), [answer for _, answer in AGENT_TURNS])
    server = serve(str(qwen3_5_dir), "--backend", "replay", "--replay", str(replay), "--served-model-name", "qwen",
                   "--otlp-endpoint", phoenix.url)
    agent_conversation(OpenAI(base_url=server.base_url, api_key="unused"))
    record = wait_until(lambda: found if len((found := server.get(f"/v1/sessions/{AGENT_SESSION}")[1]).get(
        "steps", [])) == 6 else None, 60, every=0.2, what="the six requests stored")
    server.stop()
    return record


def received(phoenix, trace_id, count, timeout=60):
    """Phoenix's spans of the trace once it holds `count`, or what it holds at the deadline (for the
    caller's checks to say what is missing)."""
    spans = wait_until(lambda: found if len(found := phoenix.spans(trace_id)) >= count else None, timeout,
                       every=0.5, or_last=True)
    return spans or phoenix.spans(trace_id)


def stored_and_received(phoenix, server, trace_id) -> tuple[dict, dict]:
    stored = {s["name"]: s for s in server.get(f"/v1/traces/{trace_id}")[1]["spans"]}
    return stored, {s["name"]: s for s in received(phoenix, trace_id, len(stored))}


def test_every_turn_arrives_whole_with_its_tool_results(exported):
    # The store keeps turns 2 and 3 as what they add, and reads them back whole; a receiver gets them
    # whole as sent: the same attributes, value for value, and none of the store's deltas.
    phoenix, server, turns, long, _ = exported
    for n, turn in enumerate(turns):
        stored, spans = stored_and_received(phoenix, server, turn["trace_id"])
        assert set(spans) == set(stored) == TREES[n]
        root_id = next(s for s in spans.values() if s["parent_id"] is None)["context"]["span_id"]
        for name, span in spans.items():
            got = span["attributes"]
            assert span["context"]["span_id"] == stored[name]["span_id"]
            assert span["parent_id"] in (None, root_id)
            assert not DELTAS & set(got), (n, name)
            want = dict(stored[name]["attributes"])
            if attr.TOOL_RESULT in want:  # the store's name for it; the conventions' over OTLP
                want[attr.GEN_AI_TOOL_CALL_RESULT] = want.pop(attr.TOOL_RESULT)
            # Phoenix adds derived keys of its own (llm.*, session.id); ours all arrive unchanged.
            assert {k: got.get(k) for k in want} == want, (n, name)
        root = "responses qwen" if n == 2 else "chat qwen"
        messages = json.loads(spans[root]["attributes"][attr.GEN_AI_INPUT_MESSAGES])
        assert len(messages) == 1 + 2 * n and messages[0]["parts"][0]["content"] == QUESTION
        if n < 2:
            tool = next(s for name, s in spans.items() if name.startswith("execute_tool"))["attributes"]
            assert tool[attr.GEN_AI_TOOL_CALL_ID] == turn["call"]["id"]
            assert tool[attr.GEN_AI_TOOL_CALL_RESULT] == RESULTS[n]
            assert tool[attr.TOOL_RESULT_TRACE_ID] == turns[n + 1]["trace_id"]
        tokens = expand_events(spans["decode"]["events"])
        assert len(tokens) == turn["usage"].get("completion_tokens", turn["usage"].get("output_tokens"))
    assert "".join(t["text"] for t in tokens) == ANSWER.removesuffix("<|im_end|>")


def test_every_token_of_a_long_answer_arrives(exported):
    phoenix, server, turns, long, long_trace = exported
    spans = {s["name"]: s for s in received(phoenix, long_trace, 4)}
    tokens = expand_events(spans["decode"]["events"])
    assert long.usage.completion_tokens >= 4000
    assert [t["index"] for t in tokens] == list(range(long.usage.completion_tokens))
    assert "".join(t["text"] for t in tokens) == LONG.removesuffix("<|im_end|>")


def root_of(phoenix, trace_id) -> dict:
    return next(s for s in received(phoenix, trace_id, 4) if s["parent_id"] is None)


def test_phoenix_shows_each_request_as_an_llm_call_with_its_whole_conversation(exported):
    """Phoenix derives its LLM span from the GenAI attributes (gen_ai.input.messages and the rest):
    model, every message of the conversation on every turn, the answer, tool calls and definitions,
    token counts with the reasoning, the session; and shows our input.value and output.value."""
    phoenix, server, turns, long, _ = exported
    for n, turn in enumerate(turns):
        root = root_of(phoenix, turn["trace_id"])
        assert root["span_kind"] == "LLM"
        a = root["attributes"]
        assert a["llm.model_name"] == "qwen" and a["session.id"] == SESSION
        roles = [a.get(f"llm.input_messages.{i}.message.role") for i in range(2 * n + 2)]
        assert roles == ["user", "assistant", "tool", "assistant", "tool"][:2 * n + 1] + [None]
        assert a["llm.input_messages.0.message.content"] == QUESTION
        for k in range(n):  # each earlier call, and its result, in this turn's input
            assert a[f"llm.input_messages.{2 * k + 1}.message.tool_calls.0.tool_call.id"] == turns[k]["call"]["id"]
            assert a[f"llm.input_messages.{2 * k + 2}.message.content"] == RESULTS[k]
        usage = turn["usage"]
        prompt, completion = usage.get("prompt_tokens", usage.get("input_tokens")), \
            usage.get("completion_tokens", usage.get("output_tokens"))
        details = usage.get("completion_tokens_details") or usage.get("output_tokens_details")
        assert (a["llm.token_count.prompt"], a["llm.token_count.completion"]) == (prompt, completion)
        assert a["llm.token_count.completion_details.reasoning"] == details["reasoning_tokens"] > 0
        cached = (usage.get("prompt_tokens_details") or usage.get("input_tokens_details"))["cached_tokens"]
        assert a["llm.token_count.prompt_details.cache_read"] == cached  # from gen_ai.usage.cache_read.input_tokens
        output = "llm.output_messages.0.message."
        assert a[output + "role"] == "assistant"
        assert json.loads(a["llm.tools.0.tool.json_schema"])["function"]["name"] == "get_weather"
        # What the trace list and the session view show of the turn: what it brought, and the answer.
        assert a["input.value"] == (QUESTION if n == 0 else f"tool: {RESULTS[n - 1]}")
        if n < 2:
            made = turn["call"]
            assert a[output + "tool_calls.0.tool_call.id"] == made["id"]
            assert a[output + "tool_calls.0.tool_call.function.name"] == made["name"]
            assert a["input.mime_type"] == a["output.mime_type"] == "text/plain"
            assert a["output.value"] == f"{made['name']}({made['arguments']})"
        else:
            contents = [(a.get(f"{output}contents.{i}.message_content.type"),
                         a.get(f"{output}contents.{i}.message_content.text")) for i in range(2)]
            assert contents[0][0] == "reasoning" and contents[1] == ("text", turn["text"])
            assert a["output.value"] == turn["text"]


def test_the_steps_inside_a_request_have_a_kind_and_the_tool_span_its_result(exported):
    phoenix, server, turns, long, _ = exported
    spans = {s["name"]: s for s in received(phoenix, turns[0]["trace_id"], 5)}
    assert {name: spans[name]["span_kind"] for name in ("render", "prefill", "decode")} == {
        "render": "PROMPT", "prefill": "CHAIN", "decode": "CHAIN"}
    tool = spans["execute_tool get_weather"]
    assert tool["span_kind"] == "TOOL"
    assert tool["attributes"]["tool.name"] == "get_weather"
    assert tool["attributes"]["output.value"] == RESULTS[0]  # Phoenix's, from gen_ai.tool.call.result


def phoenix_session(phoenix, session: str = SESSION) -> dict:
    with urllib.request.urlopen(f"{phoenix.url}/v1/sessions/{session}", timeout=30) as response:
        return json.loads(response.read())["data"]


def test_phoenix_groups_the_turns_as_one_session(exported):
    phoenix, server, turns, long, _ = exported
    session = phoenix_session(phoenix)
    assert [t["trace_id"] for t in session["traces"]] == [t["trace_id"] for t in turns]
    prompt = sum(t["usage"].get("prompt_tokens", t["usage"].get("input_tokens")) for t in turns)
    assert session["token_count_prompt"] == prompt


def test_phoenix_trace_list_and_session_view_show_each_turns_input_and_answer(exported, browser):
    phoenix, server, turns, long, _ = exported
    shown = [QUESTION, f"tool: {RESULTS[0]}", f"tool: {RESULTS[1]}", turns[2]["text"],
             f"{turns[0]['call']['name']}({turns[0]['call']['arguments']})"]
    page = Page(browser, width=1400, height=1250)
    try:
        p = page.page
        for where, picture in (("projects/default", "phoenix-traces.png"),
                               (f"sessions/{SESSION}", "phoenix-session.png")):
            p.goto(f"{phoenix.url}/redirects/{where}")
            for text in shown:
                p.get_by_text(text, exact=False).first.wait_for(timeout=30_000)
            if os.environ.get("LOOPTRACE_SCREENSHOTS"):
                p.screenshot(path=os.path.join(os.environ["LOOPTRACE_SCREENSHOTS"], picture))
    finally:
        page.close()


def session_traces(phoenix, session: str) -> list[str]:
    """The trace ids of Phoenix's session, [] until it knows the session."""
    try:
        return [t["trace_id"] for t in phoenix_session(phoenix, session)["traces"]]
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return []
        raise


def test_phoenix_shows_the_agent_tree_nested_beside_each_requests_own_trace(phoenix, agent_tree):
    """The session's agent tree as Phoenix reports it: one more trace in the session, its AGENT spans
    main → Explore → general-purpose by parentage, each naming its steps as the store's session record
    does, and the spawning call; each request still a trace of its own, an LLM span of its agent."""
    steps = {s["trace_id"]: s["agent"] for s in agent_tree["steps"]}
    agents = {a["id"]: a for a in agent_tree["agents"]}
    traces = wait_until(lambda: found if len(found := session_traces(phoenix, AGENT_SESSION)) >= 7 else None, 60,
                        every=0.5, what="the six requests and the tree")
    (tree,) = [t for t in traces if t not in steps]
    assert set(traces) - {tree} == set(steps)
    spans = {s["attributes"][attr.GEN_AI_AGENT_ID]: s for s in received(phoenix, tree, 3)}
    assert {k: s["name"] for k, s in spans.items()} == {
        "main": "invoke_agent main", "a1": "invoke_agent Explore", "a2": "invoke_agent general-purpose"}
    main, a1, a2 = spans["main"], spans["a1"], spans["a2"]
    assert {s["span_kind"] for s in spans.values()} == {"AGENT"}
    assert main["parent_id"] is None
    assert a1["parent_id"] == main["context"]["span_id"] and a2["parent_id"] == a1["context"]["span_id"]
    for name, span in spans.items():
        a = span["attributes"]
        assert a["session.id"] == AGENT_SESSION  # Phoenix's, from gen_ai.conversation.id
        own = [trace for trace, agent in steps.items() if agent == name]
        assert list(a[attr.AGENT_STEP_TRACE_IDS]) == own and a[attr.AGENT_STEPS] == agents[name]["steps"] == 2
        assert a["input.value"] == TASKS[name]
        if name != "main":  # the parent's step whose Task call spawned it, as the session record says
            spawned = agents[name]["spawned_by"]
            assert (a[attr.AGENT_SPAWNED_BY_TRACE_ID], a[attr.AGENT_SPAWNED_BY_TOOL_CALL_ID]) == (
                spawned["trace_id"], spawned["tool_call_id"])
    assert a1["attributes"]["output.value"] == "notes.txt holds it."
    assert main["attributes"]["output.value"] == "The word is in notes.txt."
    # A parent spans its subagents: the tree's root covers every step.
    assert main["start_time"] <= a1["start_time"] <= a2["start_time"] and a2["end_time"] <= main["end_time"]
    for trace, agent in steps.items():
        root = root_of(phoenix, trace)
        assert root["span_kind"] == "LLM" and root["attributes"][attr.GEN_AI_AGENT_ID] == agent


def test_phoenix_draws_the_agent_tree_in_its_trace_view(phoenix, agent_tree, browser):
    traces = wait_until(lambda: found if len(found := session_traces(phoenix, AGENT_SESSION)) >= 7 else None, 60,
                        every=0.5, what="the six requests and the tree")
    (tree,) = [t for t in traces if t not in {s["trace_id"] for s in agent_tree["steps"]}]
    page = Page(browser, width=1400, height=900)
    try:
        p = page.page
        p.goto(f"{phoenix.url}/redirects/traces/{tree}")
        for name in ("invoke_agent main", "invoke_agent Explore", "invoke_agent general-purpose"):
            p.get_by_text(name, exact=True).first.wait_for(timeout=30_000)
        if os.environ.get("LOOPTRACE_SCREENSHOTS"):
            p.screenshot(path=os.path.join(os.environ["LOOPTRACE_SCREENSHOTS"], "phoenix-agents.png"))
    finally:
        page.close()
