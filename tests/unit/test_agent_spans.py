"""A session's agent tree over OTLP (issue 57): one `invoke_agent` span per agent, a subagent's under
its parent's, in a trace of their own beside the requests' (each still its own trace, as the store
keeps it); linked to their steps and to the call that spawned them; sent once the agent's subtree is
quiet, all at shutdown; none for a session of the main agent alone. The real app with the replay
backend, its OTLP sink's transport in memory (Phoenix reads them in tests/integration/test_otlp.py)."""

from __future__ import annotations

from looptrace.common import attributes as attr
from looptrace.trace_store.agent_spans import AgentSpans, agent_span_id, agent_trace_id

from .test_otlp_export import Clock, exporting, settings_for
from .test_token_continuity import ANSWER, READ, call_output
from traced_app import run

TASK = {"type": "function", "function": {"name": "Task", "description": "Run a subagent.", "parameters": {
    "type": "object", "properties": {"prompt": {"type": "string"}}, "required": ["prompt"]}}}
SPAWN = call_output("qwen3_5", "Task", {"prompt": "Explore the repository for the word."})
SESSION = "agent-spans-1"
SAID = {"X-Claude-Code-Session-Id": SESSION}
A1 = {**SAID, "x-claude-code-agent-id": "a1", "x-claude-code-agent-type": "Explore"}
A2 = {**SAID, "x-claude-code-agent-id": "a2", "x-claude-code-parent-agent-id": "a1",
      "x-claude-code-agent-type": "general-purpose"}
# main spawns a1, a1 spawns a2, a2 answers, a1 answers, main answers: (whose turn, its answer, its task)
TURNS = [(SAID, SPAWN, "Find the word, with a subagent."), (A1, SPAWN, "Explore the repository for the word."),
         (A2, ANSWER["qwen3_5"], "Read notes.txt."), (A1, ANSWER["qwen3_5"], None), (SAID, ANSWER["qwen3_5"], None)]


def tree_session(qwen3_5_dir, tmp_path, turns=TURNS):
    """The turns through the app; (what the OTLP sink sent by its shutdown, each turn's answer)."""
    app, sent = exporting(settings_for(qwen3_5_dir, tmp_path, [t[1] for t in turns],
                                       otlp_endpoint="http://127.0.0.1:9/unused"))
    conversations: dict[str, list] = {}

    async def session():
        answers = []
        async with app:
            for headers, _, task in turns:
                messages = conversations.setdefault(headers.get("x-claude-code-agent-id", "main"), [])
                if task:
                    messages.append({"role": "user", "content": task})
                status, body = await app.chat(headers=headers, messages=messages, tools=[TASK, READ])
                assert status == 200, body
                answers.append(body)
                message = body["choices"][0]["message"]
                messages.append({"role": "assistant", "content": message.get("content") or "",
                                 "tool_calls": message.get("tool_calls")})
                for call in message.get("tool_calls") or []:
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": "done"})
            assert app.telemetry.flush()
            assert not [s for s in sent.get_finished_spans() if s.name.startswith(attr.SPAN_INVOKE_AGENT)]
        return answers

    answers = run(session())
    return sent.get_finished_spans(), answers, app


def test_each_agent_is_an_invoke_agent_span_under_its_parent_in_the_sessions_agent_tree(qwen3_5_dir, tmp_path):
    spans, answers, _ = tree_session(qwen3_5_dir, tmp_path)
    agents = {s.attributes[attr.GEN_AI_AGENT_ID]: s for s in spans if s.name.startswith(attr.SPAN_INVOKE_AGENT)}
    assert set(agents) == {"main", "a1", "a2"}
    main, a1, a2 = agents["main"], agents["a1"], agents["a2"]
    assert [s.name for s in (main, a1, a2)] == ["invoke_agent main", "invoke_agent Explore",
                                               "invoke_agent general-purpose"]
    # One trace, derived from the session: the main agent its root, each subagent under its parent.
    assert {s.context.trace_id for s in agents.values()} == {agent_trace_id(None, SESSION)}
    assert main.context.span_id == agent_span_id(None, SESSION, "main")
    assert main.parent is None and a1.parent.span_id == main.context.span_id
    assert a2.parent.span_id == a1.context.span_id
    for span in agents.values():
        assert span.attributes[attr.GEN_AI_OPERATION_NAME] == "invoke_agent"
        assert span.attributes[attr.GEN_AI_CONVERSATION_ID] == SESSION
        assert span.attributes[attr.OPENINFERENCE_SPAN_KIND] == "AGENT"

    # Each request is still its own trace; an agent span links to its steps' request spans, in order.
    requests = sorted((s for s in spans if attr.ENDPOINT in (s.attributes or {})), key=lambda s: s.start_time)
    assert len({s.context.trace_id for s in requests}) == 5
    assert not {s.context.trace_id for s in requests} & {main.context.trace_id}
    whose = {"main": [0, 4], "a1": [1, 3], "a2": [2]}
    for name, span in agents.items():
        steps = [requests[i] for i in whose[name]]
        assert span.attributes[attr.AGENT_STEPS] == len(steps)
        assert list(span.attributes[attr.AGENT_STEP_TRACE_IDS]) == [format(s.context.trace_id, "032x") for s in steps]
        step_links = [link for link in span.links if link.attributes[attr.LINK] == "step"]
        assert [(link.context.trace_id, link.context.span_id) for link in step_links] == [
            (s.context.trace_id, s.context.span_id) for s in steps]
        # It spans its steps and its subagents' (a parent covers its children).
        assert span.start_time == steps[0].start_time
    assert main.end_time == requests[4].end_time and a1.end_time == requests[3].end_time
    # The task it was given and what it answered last, as Phoenix shows them.
    assert a1.attributes[attr.INPUT_VALUE] == "Explore the repository for the word."
    assert a1.attributes[attr.OUTPUT_VALUE] == requests[3].attributes[attr.OUTPUT_VALUE]

    # A subagent names, and links to, the parent's Task call that spawned it.
    tools = {s.attributes[attr.GEN_AI_TOOL_CALL_ID]: s for s in spans if s.name == "execute_tool Task"}
    for child, parent_step, answer in ((a1, requests[0], answers[0]), (a2, requests[1], answers[1])):
        call_id = answer["choices"][0]["message"]["tool_calls"][0]["id"]
        assert child.attributes[attr.AGENT_SPAWNED_BY_TRACE_ID] == format(parent_step.context.trace_id, "032x")
        assert child.attributes[attr.AGENT_SPAWNED_BY_TOOL_CALL_ID] == call_id
        (link,) = [link for link in child.links if link.attributes[attr.LINK] == "spawned_by"]
        assert (link.context.trace_id, link.context.span_id) == (tools[call_id].context.trace_id,
                                                                 tools[call_id].context.span_id)
    assert attr.AGENT_SPAWNED_BY_TRACE_ID not in main.attributes


def test_a_session_of_the_main_agent_alone_sends_no_agent_span(qwen3_5_dir, tmp_path):
    spans, _, _ = tree_session(qwen3_5_dir, tmp_path, [(SAID, ANSWER["qwen3_5"], "Hello."),
                                                       (SAID, ANSWER["qwen3_5"], "And again.")])
    assert not [s for s in spans if s.name.startswith(attr.SPAN_INVOKE_AGENT)]
    assert len([s for s in spans if attr.ENDPOINT in (s.attributes or {})]) == 2


def test_an_agent_span_goes_once_its_subtree_is_quiet_and_a_lone_main_agent_waits_for_a_subagent(
        qwen3_5_dir, tmp_path):
    spans, _, _ = tree_session(qwen3_5_dir, tmp_path)
    steps = sorted((s for s in spans if attr.ENDPOINT in (s.attributes or {}) or s.name == "execute_tool Task"),
                   key=lambda s: s.end_time)
    requests = [s for s in steps if attr.ENDPOINT in s.attributes]
    clock = Clock()
    agents = AgentSpans(quiet=60, clock=clock)
    tools_of_first = [s for s in steps if s.context.trace_id == requests[0].context.trace_id and s is not requests[0]]
    for span in [*tools_of_first, requests[0]]:
        agents.saw(span)
    clock.now += 600  # the main agent alone, quiet: nothing to draw, and nothing held
    assert agents.take() == [] and agents.held == 0
    for span in steps:
        if span not in tools_of_first and span is not requests[0] and span is not requests[4]:
            clock.now += 1
            agents.saw(span)
    assert agents.held == 3 and agents.take() == []
    # a2 was last heard a second before a1's last step, which its parents wait on (a parent waits for its children).
    assert agents.due_in() == 59
    clock.now += 59
    assert [s.attributes[attr.GEN_AI_AGENT_ID] for s in agents.take()] == ["a2"]
    clock.now += 1
    assert [s.attributes[attr.GEN_AI_AGENT_ID] for s in agents.take()] == ["a1", "main"]
    agents.saw(requests[4])  # the main agent's later step: its span went already, and is not sent again
    assert agents.held == 0 and agents.take(everything=True) == [] and agents.due_in() is None
