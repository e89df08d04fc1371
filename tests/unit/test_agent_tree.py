"""Agent trees (issue 57): a harness's subagents send their turns in the main agent's session, and
each agent is its own conversation line. Through the real app (Qwen3.5's template, the replay
backend), with Claude Code's header shapes (main → a1 → a2) and codex's (root → child, and a side
request it labels): the session record answers the tree and every step its agent; a subagent's
turns neither fork the main agent's nor are forks; under `keep` the main line keeps its ids."""

from __future__ import annotations

import uuid

import pytest

from looptrace.common import attributes as attr
from looptrace.proxy.export.trajectory import stitched
from looptrace.proxy.settings import Settings
from looptrace.trace_store.recorded_sessions import open_reader, session_steps

import stores as store_kinds
from .test_otlp_export import exporting, roots_in_order, settings_for
from .test_token_continuity import ANSWER, READ, call_output, classes_counted
from app_thread import AppThread, Reading
from traced_app import run

TASK = {"type": "function", "function": {"name": "Task", "description": "Run a subagent.", "parameters": {
    "type": "object", "properties": {"prompt": {"type": "string"}}, "required": ["prompt"]}}}
TOOLS = [TASK, READ]


def started_app(qwen3_5_dir, folder, trace_db: str | None = None) -> AppThread:
    """The real app on Qwen3.5's checkpoint, the replay backend and a store (SQLite in `folder` by default)."""
    placeholder = folder / "none.jsonl"
    placeholder.write_text('{"text": "unused"}\n')
    return AppThread(Settings(model=str(qwen3_5_dir), backend="replay", replay=str(placeholder),
                              served_model_name="tiny", trace_db=trace_db or str(folder / "traces.sqlite3"),
                              token_continuity="off")).start()


@pytest.fixture(scope="module", params=store_kinds.KINDS)
def app(request, qwen3_5_dir, tmp_path_factory):
    """On each store: SQLite and PostgreSQL."""
    folder = tmp_path_factory.mktemp("agents")
    made = store_kinds.of_param(request, folder)
    started = started_app(qwen3_5_dir, folder, made.setting())
    yield started
    started.stop()
    made.close()


class Agent:
    """One agent's conversation, sent as its harness sends it: its headers on every turn."""

    def __init__(self, app: AppThread, headers: dict, mode: str, task: str) -> None:
        self.app, self.headers, self.mode = app, headers, mode
        self.messages = [{"role": "user", "content": task}]
        self.kinds: list[str | None] = []  # how each turn continued this agent's last (None: not classed)
        self.read: list[list[int]] = []
        self.wrote: list[list[int]] = []
        self.trace_ids: list[str] = []

    def turn(self, output: str, then: str = "go on") -> dict:
        before = classes_counted(self.app)
        backend = Reading(self.app.replay(output))
        self.app.runtime.backend = backend
        status, answer = self.app.call("POST", "/v1/chat/completions", {
            "model": "tiny", "messages": self.messages, "tools": TOOLS, "token_continuity": self.mode},
            headers=self.headers)
        assert status == 200, answer
        after = classes_counted(self.app)
        changed = [k for k in after if after[k] != before[k]]
        assert len(changed) <= 1, changed
        self.kinds.append(changed[0] if changed else None)
        self.read.append(backend.read[0])
        self.wrote.append(backend.wrote[0])
        message = {k: v for k, v in answer["choices"][0]["message"].items()
                   if k in ("role", "content", "tool_calls", "reasoning_content")}
        message["content"] = message.get("content") or ""
        self.messages.append(message)
        if message.get("tool_calls"):
            self.messages.append({"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": then})
        else:
            self.messages.append({"role": "user", "content": then})
        return answer


def claude_code(app: AppThread, session: str, mode: str) -> tuple[Agent, Agent, Agent]:
    """Claude Code's shapes: the main agent sends its session alone; a subagent its id, its type and
    (a sub-subagent) its parent's id."""
    said = {"X-Claude-Code-Session-Id": session}
    main = Agent(app, said, mode, "Find where the word is, with a subagent.")
    a1 = Agent(app, {**said, "x-claude-code-agent-id": "a1", "x-claude-code-agent-type": "Explore"}, mode,
               "Explore the repository for the word.")
    a2 = Agent(app, {**said, "x-claude-code-agent-id": "a2", "x-claude-code-parent-agent-id": "a1",
                     "x-claude-code-agent-type": "general-purpose"}, mode, "Read notes.txt.")
    return main, a1, a2


SPAWN = call_output("qwen3_5", "Task", {"prompt": "Explore the repository for the word."})
READS = call_output("qwen3_5", "read_file", {"path": "notes.txt"})


def test_claude_codes_subagents_are_a_tree_and_none_of_their_turns_is_a_fork(app):
    session = "cc-" + uuid.uuid4().hex[:12]
    main, a1, a2 = claude_code(app, session, "check")
    main.turn(SPAWN, then="The subagent said: in notes.txt")
    a1.turn(SPAWN, then="The sub-subagent said: notes.txt")
    a2.turn(READS, then="the word")
    a2.turn(ANSWER["qwen3_5"])
    a1.turn(ANSWER["qwen3_5"])
    main.turn(ANSWER["qwen3_5"])
    for agent in (main, a1, a2):
        assert agent.kinds[0] is None and agent.kinds[1] in ("clean", "realign"), agent.kinds

    found = app.stored(f"/v1/sessions/{session}", steps=6)
    agents = {a["id"]: a for a in found["agents"]}
    assert [a["id"] for a in found["agents"] if a["parent"] is None] == ["main"]
    assert (agents["a1"]["parent"], agents["a2"]["parent"]) == ("main", "a1")
    assert (agents["a1"]["type"], agents["a2"]["type"]) == ("Explore", "general-purpose")
    assert [agents[k]["steps"] for k in ("main", "a1", "a2")] == [2, 2, 2]
    assert [s["agent"] for s in found["steps"]] == ["main", "a1", "a2", "a2", "a1", "main"]
    first, *_, last = found["steps"]
    assert agents["main"]["first_ns"] == first["start_ns"] and agents["main"]["last_ns"] == last["end_ns"]
    # Each subagent under the step whose Task call spawned it, by the call's id.
    spawned = agents["a1"]["spawned_by"]
    assert spawned["trace_id"] == first["trace_id"]
    assert spawned["tool_call_id"] == first["tool_calls"][0]["id"]
    assert agents["a2"]["spawned_by"]["trace_id"] == found["steps"][1]["trace_id"]
    # A page of the steps still answers the whole tree, and each of its steps' agent.
    page = app.stored(f"/v1/sessions/{session}?offset=2&limit=2")
    assert page["agents"] == found["agents"] and [s["agent"] for s in page["steps"]] == ["a2", "a2"]
    # The sessions list says how many agents it had.
    (listed,) = [r for r in app.stored("/v1/sessions?limit=500")["data"] if r["key"] == session]
    assert listed["agents"] == 3 and listed["steps"] == 6


def test_under_keep_the_main_line_keeps_its_sampled_ids_across_a_subagents_turns(app):
    session = "keep-" + uuid.uuid4().hex[:12]
    main, a1, _ = claude_code(app, session, "keep")
    main.turn(SPAWN, then="The subagent said: in notes.txt")
    a1.turn(READS, then="the word")
    a1.turn(ANSWER["qwen3_5"])
    main.turn(ANSWER["qwen3_5"])
    assert main.kinds == [None, "kept"] and a1.kinds == [None, "kept"]
    # The main agent's second prompt is its first prompt and the very ids the model sampled, then the rest.
    kept = main.read[0] + main.wrote[0]
    assert main.read[1][:len(kept)] == kept
    assert a1.read[1][:len(a1.read[0]) + len(a1.wrote[0])] == a1.read[0] + a1.wrote[0]


def test_codexs_root_thread_is_the_main_agent_and_its_labelled_side_request_an_agent_of_its_kind(app):
    root = "codex-" + uuid.uuid4().hex[:12]
    main = Agent(app, {"session-id": root, "thread-id": root}, "check", "Spawn a helper.")
    child = Agent(app, {"session-id": root, "thread-id": "child-1", "x-codex-parent-thread-id": root,
                        "x-openai-subagent": "collab_spawn"}, "check", "Help.")
    review = Agent(app, {"session-id": root, "thread-id": root, "x-openai-subagent": "review"}, "check",
                   "Review the change.")
    main.turn(SPAWN, then="The helper said: done")
    child.turn(ANSWER["qwen3_5"])
    review.turn(ANSWER["qwen3_5"])
    main.turn(ANSWER["qwen3_5"])
    assert main.kinds[1] in ("clean", "realign") and child.kinds == [None] and review.kinds == [None]

    found = app.stored(f"/v1/sessions/{root}", steps=4)
    agents = {a["id"]: a for a in found["agents"]}
    assert [a["id"] for a in found["agents"] if a["parent"] is None] == [root]
    assert agents["child-1"]["parent"] == root and agents["child-1"]["type"] == "collab_spawn"
    assert agents["review"] == {**agents["review"], "parent": root, "type": "review", "side": True, "steps": 1}
    assert [s["agent"] for s in found["steps"]] == [root, "child-1", "review", root]


def test_a_hostile_agent_id_is_not_an_agent_and_its_turn_stays_on_the_main_line(app):
    """An id with control characters is recorded as nothing: the request is the main agent's."""
    session = "hostile-" + uuid.uuid4().hex[:12]
    main = Agent(app, {"X-Claude-Code-Session-Id": session}, "check", "Hello.")
    odd = Agent(app, {"X-Claude-Code-Session-Id": session, "x-claude-code-agent-id": "a" * 300}, "check", "Hi.")
    main.turn(ANSWER["qwen3_5"])
    odd.turn(ANSWER["qwen3_5"])
    found = app.stored(f"/v1/sessions/{session}", steps=2)
    assert [a["id"] for a in found["agents"]] == ["main"] and found["agents"][0]["steps"] == 2
    (listed,) = [r for r in app.stored("/v1/sessions?limit=500")["data"] if r["key"] == session]
    assert listed["agents"] == 1


def test_the_training_export_stitches_each_agents_line_token_exact_and_names_its_agent(app):
    """Under `keep`: the main agent's two turns one trajectory across its subagent's, the subagent's
    two turns another; each holds exactly the ids its engine read and sampled, and says whose it is."""
    session = "export-" + uuid.uuid4().hex[:12]
    main, a1, _ = claude_code(app, session, "keep")
    main.turn(SPAWN, then="The subagent said: in notes.txt")
    a1.turn(READS, then="the word")
    a1.turn(ANSWER["qwen3_5"])
    main.turn(ANSWER["qwen3_5"])
    app.stored(f"/v1/sessions/{session}", steps=4)
    lines = stitched(session_steps(open_reader(app.settings.trace_db), session))
    assert [(t.agent, len(t.steps)) for t in lines] == [("main", 2), ("a1", 2)]
    for trajectory, agent in zip(lines, (main, a1)):
        assert trajectory.held == agent.read[1] + agent.wrote[1]
        assert [i for i, m in zip(trajectory.response_ids, trajectory.response_mask) if m] == agent.wrote[0] + agent.wrote[1]


def test_exported_spans_name_their_agent_in_the_genai_conventions_beside_looptraces(qwen3_5_dir, tmp_path):
    """Over OTLP (the sink's transport in memory): the main agent's request span says `main`, a
    subagent's its id and type, under the conventions' names and looptrace's."""
    app, sent = exporting(settings_for(qwen3_5_dir, tmp_path, [ANSWER["qwen3_5"]] * 2,
                                       otlp_endpoint="http://127.0.0.1:9/unused"))
    said = {"X-Claude-Code-Session-Id": "otlp-agents"}
    ask = [{"role": "user", "content": "Hello."}]

    async def session():
        async with app:
            for headers in (said, {**said, "x-claude-code-agent-id": "a1", "x-claude-code-agent-type": "Explore"}):
                status, body = await app.chat(headers=headers, messages=ask)
                assert status == 200, body
            assert app.telemetry.flush()

    run(session())
    main, sub = roots_in_order(sent.get_finished_spans())
    assert (main.attributes[attr.GEN_AI_AGENT_ID], main.attributes[attr.GEN_AI_AGENT_NAME]) == ("main", "main")
    assert attr.AGENT_ID not in main.attributes
    assert (sub.attributes[attr.GEN_AI_AGENT_ID], sub.attributes[attr.GEN_AI_AGENT_NAME]) == ("a1", "Explore")
    assert (sub.attributes[attr.AGENT_ID], sub.attributes[attr.AGENT_TYPE]) == ("a1", "Explore")
    assert main.attributes[attr.GEN_AI_CONVERSATION_ID] == sub.attributes[attr.GEN_AI_CONVERSATION_ID] == "otlp-agents"


def test_the_compare_api_compares_one_agents_line_of_two_sessions(app):
    """Two runs of one task: each subagent's id is its run's own; ?agent_a=&agent_b= align their lines."""
    keys = []
    for sub in ("x1", "y1"):
        session = f"compare-{sub}-" + uuid.uuid4().hex[:8]
        said = {"X-Claude-Code-Session-Id": session}
        main = Agent(app, said, "check", "Find the word, with a subagent.")
        child = Agent(app, {**said, "x-claude-code-agent-id": sub, "x-claude-code-agent-type": "Explore"}, "check",
                      "Explore the repository for the word.")
        main.turn(SPAWN, then="The subagent said: in notes.txt")
        child.turn(READS, then="the word")
        child.turn(ANSWER["qwen3_5"])
        main.turn(ANSWER["qwen3_5"])
        app.stored(f"/v1/sessions/{session}", steps=4)
        keys.append(session)
    status, found = app.call("GET", f"/v1/compare?a={keys[0]}&b={keys[1]}&agent_a=x1&agent_b=y1")
    assert status == 200, found
    assert (found["summary"]["steps_a"], found["summary"]["steps_b"], found["summary"]["compared"]) == (2, 2, 2)
    assert found["steps"][0]["tool_calls_equal"] and found["summary"]["steps_agreeing"] == 2
    status, whole = app.call("GET", f"/v1/compare?a={keys[0]}&b={keys[1]}")
    assert status == 200 and whole["summary"]["steps_a"] == 4
    status, error = app.call("GET", f"/v1/compare?a={keys[0]}&b={keys[1]}&agent_a=y1")
    assert status == 404 and error["error"]["code"] == "agent_not_found" and error["error"]["param"] == "agent_a"
    status, error = app.call("GET", f"/v1/compare?a={keys[0]}&b={keys[1]}&agent_b=%07bell")
    assert status == 400 and error["error"]["param"] == "agent_b"


def test_a_responses_chain_by_previous_response_id_stays_on_its_agents_line(app):
    """codex's shape over the Responses API: the root's second turn names its first by
    previous_response_id after a child thread's turn; under `keep` it is kept, its ids the first's."""
    root = "codex-responses-" + uuid.uuid4().hex[:8]
    said = {"session-id": root, "thread-id": root}
    child = {"session-id": root, "thread-id": "child-r", "x-codex-parent-thread-id": root,
             "x-openai-subagent": "collab_spawn"}
    backend = Reading(app.replay(ANSWER["qwen3_5"], ANSWER["qwen3_5"], ANSWER["qwen3_5"]))
    app.runtime.backend = backend
    kinds = []
    previous = None
    for headers, text in ((said, "Spawn a helper."), (child, "Help."), (said, "Thanks; now finish.")):
        before = classes_counted(app)
        body = {"model": "tiny", "input": text, "token_continuity": "keep", "store": True}
        if headers is said and previous is not None:
            body["previous_response_id"] = previous
        status, answer = app.call("POST", "/v1/responses", body, headers=headers)
        assert status == 200, answer
        after = classes_counted(app)
        kinds.append(next((k for k in after if after[k] != before[k]), None))
        if headers is said:
            previous = answer["id"]
    assert kinds == [None, None, "kept"]
    kept = backend.read[0] + backend.wrote[0]
    assert backend.read[2][:len(kept)] == kept
