"""`looptrace export --format atif` (issue 45): a session as an ATIF v1.8 trajectory, validated with the
`atif` package's own pydantic models (pinned in the test extra); its token ids and logprobs the store's;
a subagent's requests (Claude Code's and codex's headers) as an embedded trajectory, referenced from the
call that spawned it; a harness that rewrote its history marks what it repeated as copied context."""

from __future__ import annotations

import json

import atif
import pytest

from looptrace.common import attributes as attr
from looptrace.proxy import cli
from looptrace.proxy.api.clients import subagent_of
from looptrace.proxy.settings import Settings

from app_thread import AppThread

TASK = [{"type": "function", "function": {"name": "Task", "description": "Run a subagent.", "parameters": {
    "type": "object", "properties": {"prompt": {"type": "string"}}, "required": ["prompt"]}}}]
SPAWN = ("I will delegate.\n</think>\n\n<tool_call>\n<function=Task>\n<parameter=prompt>\nlook around\n</parameter>\n"
         "</function>\n</tool_call><|im_end|>")
FOUND = "Looking.\n</think>\n\nFound it.<|im_end|>"
DONE = "Good.\n</think>\n\nDone.<|im_end|>"


@pytest.fixture(scope="module")
def app(qwen3_5_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("atif")
    (folder / "none.jsonl").write_text('{"text": "unused"}\n')
    running = AppThread(Settings(model=str(qwen3_5_dir), backend="replay", replay=str(folder / "none.jsonl"),
                                 served_model_name="tiny", trace_db=str(folder / "traces.sqlite3"))).start()
    yield running
    running.stop()


def export(app: AppThread, key: str, tmp_path) -> dict:
    """The command as a user runs it; one session, so one line, validated by atif's models."""
    out = tmp_path / f"{key}.jsonl"
    with pytest.raises(SystemExit) as done:
        cli.main(["export", "--store", app.runtime.settings.trace_db, "--session", key, "--format", "atif",
                  "--out", str(out)])
    assert done.value.code == 0
    (line,) = out.read_text().splitlines()
    document = json.loads(line)
    atif.Trajectory.model_validate(document)
    return document


def chat(app: AppThread, messages: list[dict], headers: dict) -> dict:
    status, answer = app.call("POST", "/v1/chat/completions", {"model": "tiny", "messages": messages, "tools": TASK,
                                                               "logprobs": True}, headers)
    assert status == 200, answer
    return answer["choices"][0]["message"]


def delegate(app: AppThread, main: dict, sub: dict | None) -> str:
    """A main agent that spawns a subagent with a tool call, the subagent's one request (its own
    messages, the same conversation; none without `sub`), and the main agent's answer once the tool
    returned."""
    app.replay(*((SPAWN, FOUND, DONE) if sub is not None else (SPAWN, DONE)))
    messages = [{"role": "system", "content": "You lead."}, {"role": "user", "content": "Find the file."}]
    spawned = chat(app, messages, main)
    if sub is not None:
        chat(app, [{"role": "system", "content": "You search."}, {"role": "user", "content": "look around"}], sub)
    call = spawned["tool_calls"][0]
    echo = {"role": "assistant", "content": spawned["content"] or "", "tool_calls": spawned["tool_calls"]}
    chat(app, messages + [echo, {"role": "tool", "tool_call_id": call["id"], "content": "Found it."}], main)
    return call["id"]


def agent_steps(document: dict) -> list[dict]:
    return [s for s in document["steps"] if s["source"] == "agent"]


def test_a_session_exports_as_an_atif_trajectory_with_the_stores_ids_and_logprobs(app, tmp_path):
    call_id = delegate(app, {"session_id": "plain-1"}, None)
    app.stored("/v1/sessions/plain-1", steps=2)
    document = export(app, "plain-1", tmp_path)
    assert (document["schema_version"], document["session_id"], document["agent"]["name"]) == \
        ("ATIF-v1.8", "plain-1", "Python-urllib")
    assert [t["function"]["name"] for t in document["agent"]["tool_definitions"]] == ["Task"]
    assert [(s["source"], s["message"]) for s in document["steps"]] == [
        ("system", "You lead."), ("user", "Find the file."), ("agent", ""), ("agent", "Done.")]
    spawn = agent_steps(document)[0]
    # The tool's result is the observation of the step that called it; the answer sent back is no step.
    assert spawn["observation"] == {"results": [{"source_call_id": call_id, "content": "Found it."}]}
    assert [(c["tool_call_id"], c["function_name"], c["arguments"], c["extra"]["outcome"])
            for c in spawn["tool_calls"]] == [(call_id, "Task", {"prompt": "look around"}, "valid")]
    assert spawn["reasoning_content"] == "I will delegate."
    _, session = app.call("GET", "/v1/sessions/plain-1")
    for step, summary in zip(agent_steps(document), session["steps"]):
        trace = app.stored(f"/v1/traces/{summary['trace_id']}")
        render = next(s for s in trace["spans"] if s["name"] == attr.SPAN_RENDER)["attributes"]
        tokens = next(s for s in trace["spans"] if s["name"] == attr.SPAN_DECODE)["tokens"]
        # Equal, not close: the export copies the stored numbers, no arithmetic on any CPU.
        assert step["metrics"]["prompt_token_ids"] == render[attr.PROMPT_IDS]
        assert step["metrics"]["completion_token_ids"] == [t["id"] for t in tokens]
        assert step["metrics"]["logprobs"] == [t["logprob"] for t in tokens]
        assert step["metrics"]["prompt_tokens"] == len(render[attr.PROMPT_IDS])
        assert step["extra"]["trace_id"] == summary["trace_id"] and step["extra"]["timings"]["ttft_ms"] >= 0
    assert document["final_metrics"]["total_completion_tokens"] == sum(s["output_tokens"] for s in session["steps"])


@pytest.mark.parametrize("harness", ["claude-code", "codex"])
def test_a_subagent_is_an_embedded_trajectory_referenced_from_the_call_that_spawned_it(app, tmp_path, harness):
    key = f"lead-{harness}"
    if harness == "claude-code":  # the main agent sends no agent id; a subagent its own
        main = {"X-Claude-Code-Session-Id": key}
        sub = {**main, "x-claude-code-agent-id": "agent-7", "x-claude-code-agent-type": "general-purpose"}
    else:  # a codex child: the root's session-id, its own thread-id, its parent's thread
        main = {"session-id": key, "thread-id": key}
        sub = {"session-id": key, "thread-id": "agent-7", "x-codex-parent-thread-id": key,
               "x-openai-subagent": "collab_spawn"}
    call_id = delegate(app, main, sub)
    app.stored(f"/v1/sessions/{key}", steps=3)
    document = export(app, key, tmp_path)
    assert [(s["source"], s["message"]) for s in document["steps"]] == [
        ("system", "You lead."), ("user", "Find the file."), ("agent", ""), ("agent", "Done.")]
    (child,) = document["subagent_trajectories"]
    assert (child["trajectory_id"], child["session_id"]) == ("agent-7", key)
    assert child["extra"]["agent_type"] == ("general-purpose" if harness == "claude-code" else "collab_spawn")
    assert [(s["source"], s["message"]) for s in child["steps"]] == [
        ("system", "You search."), ("user", "look around"), ("agent", "Found it.")]
    (result,) = agent_steps(document)[0]["observation"]["results"]
    assert (result["source_call_id"], result["content"]) == (call_id, "Found it.")
    assert result["subagent_trajectory_ref"] == [{"trajectory_id": "agent-7", "session_id": key}]


def test_a_rewritten_history_is_copied_context(app, tmp_path):
    app.replay(FOUND, DONE)
    first = [{"role": "system", "content": "You lead."}, {"role": "user", "content": "Find the file."}]
    answer = chat(app, first, {"session_id": "compacted-1"})
    # The harness compacted: the old exchange summarised in a user turn, the answer kept, a new question.
    second = [{"role": "system", "content": "You lead."}, {"role": "user", "content": "Summary: a file was sought."},
              {"role": "assistant", "content": answer["content"]}, {"role": "user", "content": "And now?"}]
    chat(app, second, {"session_id": "compacted-1"})
    app.stored("/v1/sessions/compacted-1", steps=2)
    document = export(app, "compacted-1", tmp_path)
    assert [(s["source"], s["message"], s.get("is_copied_context", False)) for s in document["steps"]] == [
        ("system", "You lead.", False), ("user", "Find the file.", False), ("agent", "Found it.", False),
        ("user", "Summary: a file was sought.", True), ("agent", "Found it.", True), ("user", "And now?", False),
        ("agent", "Done.", False)]
    assert "metrics" not in document["steps"][4]  # a copied answer is no model call of this trajectory


def test_subagent_labels_that_are_not_printable_are_not_recorded():
    assert subagent_of({"x-claude-code-agent-id": "a\x1b[31m", "x-claude-code-parent-agent-id": "p"}) == {}
    assert subagent_of({"x-claude-code-agent-id": "a", "x-claude-code-parent-agent-id": "p\n"}) == \
        {attr.AGENT_ID: "a"}
    assert subagent_of({"thread-id": "t", "session-id": "t"}) == {}  # a codex root: no subagent
