"""`looptrace replay` and `looptrace export` on a real codex session: codex asked to run a command,
against a looptrace serving the tiny agent (a tiny Qwen3.5 that calls exec_command and then answers,
tests/support/tiny_agent.py), decoded by the local backend, so every recorded token has the model's
own logprob.

Replayed against the same checkpoint on another looptrace: every greedy choice agrees and the
target's logprobs are the recorded ones (1e-4, CPU float32); decoded afresh step by step, the same
tool calls. Against a copy with its weights nudged: the agreement falls below 1 and the first
divergence is where a direct computation with transformers says the two checkpoints' greedy choices
part; --min-agreement fails the command. The JUnit file is read by junitparser, the Parquet export by
pyarrow, and the compare page in Chromium marks the divergent tokens on both sides.
"""

from __future__ import annotations

import json
import subprocess

import pytest

import replays
import tiny_agent
from looptrace.common import attributes as attr

# The module's servers and its codex session are made in its first test: minutes on two busy cores.
pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    return tiny_agent.agent_checkpoint()


@pytest.fixture(scope="module")
def nudged(agent, tmp_path_factory):
    return tiny_agent.nudged(agent, tmp_path_factory.mktemp("nudged") / "agent-nudged", replays.NUDGE)


@pytest.fixture(scope="module")
def recording(serve, installed, agent, tmp_path_factory):
    recorded = replays.record_codex_session(serve, installed, tmp_path_factory.mktemp("codex"), agent)
    assert recorded.codex.returncode == 0, replays.outcome(recorded.codex)
    assert recorded.codex.stdout.strip().endswith(tiny_agent.ANSWER), replays.outcome(recorded.codex)
    return recorded


@pytest.fixture(scope="module")
def same(serve, agent):
    """The same checkpoint, served by another looptrace with a store of its own."""
    return serve(str(agent), "--served-model-name", replays.MODEL, api_key=replays.API_KEY)


@pytest.fixture(scope="module")
def other(serve, nudged):
    return serve(str(nudged), "--served-model-name", replays.MODEL, api_key=replays.API_KEY)


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    return tmp_path_factory.mktemp("reports")


def steps_of(recording) -> list[dict]:
    """Each recorded step's trace as the store holds it."""
    _, session = recording.server.get(f"/v1/sessions/{recording.session}")
    return [recording.server.get(f"/v1/traces/{s['trace_id']}")[1] for s in session["steps"]]


def span(trace: dict, name: str) -> dict:
    return next(s for s in trace["spans"] if s["name"] == name)


def test_the_recorded_session_is_codex_running_a_tool_on_a_real_model(recording):
    traces = steps_of(recording)
    assert len(traces) == 2
    (call,) = [s for s in traces[0]["spans"] if s["name"].startswith("execute_tool")]
    assert (call["attributes"][attr.GEN_AI_TOOL_NAME], json.loads(call["attributes"][attr.GEN_AI_TOOL_CALL_ARGUMENTS])) \
        == ("exec_command", {"cmd": tiny_agent.COMMAND})
    tokens = span(traces[0], "decode")["tokens"]
    # A model's own numbers (a replay backend's are p = 1 throughout): sure of each token, not certain.
    assert all(t["p"] > 0.999 for t in tokens) and sum(t["logprob"] < 0 for t in tokens) > len(tokens) // 2


def test_forced_against_the_same_checkpoint_agrees_token_for_token(recording, same, reports):
    import junitparser

    done, report, junit = replays.replay(recording.store, recording.session, same.url, reports, "forced",
                                         "--min-agreement", "1", name="same-forced")
    assert done.returncode == 0, replays.outcome(done)
    assert (report["agreement"], report["first_divergence"], report["target_kind"]) == (1.0, None, "looptrace")
    traces = steps_of(recording)
    for step, trace in zip(report["steps"], traces):
        recorded = span(trace, "decode")["tokens"]
        assert (step["tokens"], step["agreeing"], step["first_divergence"]) == (len(recorded), len(recorded), None)
        assert step["max_logprob_difference"] <= 1e-4
    assert report["steps"][0]["tool_call_tokens"] > 0 and report["steps"][0]["tool_call_agreeing"] == \
        report["steps"][0]["tool_call_tokens"]
    # The replay is a session of its own in the same store, each step linked to the one it replays,
    # its tokens the recorded ones with the target's logprobs.
    _, replayed = recording.server.get(f"/v1/sessions/{report['replay_session']}")
    assert replayed["client"] == "looptrace-replay" and len(replayed["steps"]) == 2
    for step, trace in zip(replayed["steps"], traces):
        _, mine = recording.server.get(f"/v1/traces/{step['trace_id']}")
        root = next(s for s in mine["spans"] if attr.ENDPOINT in s["attributes"])
        original = next(s for s in trace["spans"] if attr.ENDPOINT in s["attributes"])
        assert root["attributes"][attr.REPLAY_TRACE_ID] == trace["trace_id"]
        assert [(link["trace_id"], link["span_id"], link["attributes"][attr.LINK]) for link in root["links"]] == \
            [(trace["trace_id"], original["span_id"], "replay_of")]
        ours, theirs = span(mine, "decode")["tokens"], span(trace, "decode")["tokens"]
        assert [t["id"] for t in ours] == [t["id"] for t in theirs]
        assert [t["logprob"] for t in ours] == pytest.approx([t["logprob"] for t in theirs], abs=1e-4)
    suite = next(iter(junitparser.JUnitXml.fromfile(str(junit))))
    assert (suite.tests, suite.failures, suite.errors, suite.skipped) == (2, 0, 0, 0)


def test_step_mode_on_the_same_checkpoint_makes_the_same_tool_calls(recording, same, reports):
    done, report, _ = replays.replay(recording.store, recording.session, same.url, reports, "step",
                                     "--min-agreement", "1", name="same-step")
    assert done.returncode == 0, replays.outcome(done)
    first, second = report["steps"]
    assert first["tool_calls_equal"] and first["tool_calls_target"][0]["name"] == "exec_command"
    assert json.loads(first["tool_calls_target"][0]["arguments"]) == {"cmd": tiny_agent.COMMAND}
    assert (first["finish_reason_target"], second["finish_reason_target"]) == ("tool_calls", "stop")
    assert second["tool_calls_equal"] and second["tool_calls_target"] == []
    assert (report["agreement"], report["first_different_step"]) == (1.0, None)
    assert all(s["first_divergence"] is None and s["agreeing"] == s["tokens"] for s in report["steps"])


def test_forced_against_a_nudged_copy_diverges_where_a_direct_computation_says(recording, other, agent, nudged,
                                                                               reports):
    import junitparser

    done, report, junit = replays.replay(recording.store, recording.session, other.url, reports, "forced",
                                         "--min-agreement", "1", name="nudged-forced")
    assert done.returncode == 1, replays.outcome(done)  # below --min-agreement
    assert "agreement" in done.stderr and report["passed"] is False
    steps = [(span(t, "render")["attributes"][attr.PROMPT_IDS], [x["id"] for x in span(t, "decode")["tokens"]])
             for t in steps_of(recording)]
    first, agreeing = replays.first_parting(agent, nudged, steps)
    assert first is not None, "the nudge changed no greedy choice: the test would prove nothing"
    assert report["first_divergence"] == first
    assert report["agreeing"] == agreeing and report["agreement"] == agreeing / report["tokens"] < 1
    diverging = sum(s["first_divergence"] is not None for s in report["steps"])
    suite = next(iter(junitparser.JUnitXml.fromfile(str(junit))))
    assert (suite.tests, suite.failures) == (2, diverging) and diverging >= 1
    failed = next(case for case in suite if case.result)
    diverged = next(s for s in report["steps"] if s["first_divergence"] is not None)
    assert failed.result[0].message.startswith(f"token {diverged['first_divergence']}: the recording chose")
    assert diverged["divergence"]["recording_greedy_id"] != diverged["divergence"]["target_greedy_id"]


def test_the_min_agreement_passes_a_replay_that_reaches_it(recording, other, reports):
    done, report, _ = replays.replay(recording.store, recording.session, other.url, reports, "forced",
                                     "--min-agreement", "0.5", name="nudged-lenient")
    assert done.returncode == 0 and report["passed"] and 0.5 <= report["agreement"] < 1, replays.outcome(done)


def test_a_replay_that_cannot_run_says_why(recording, same, reports):
    done, _, _ = replays.replay(recording.store, "no-such-session", same.url, reports, name="missing")
    assert done.returncode == 2 and "no session 'no-such-session'" in done.stderr, replays.outcome(done)
    done, _, _ = replays.replay(recording.store, recording.session, "http://127.0.0.1:9", reports, name="down")
    assert done.returncode == 2 and "cannot reach the target" in done.stderr, replays.outcome(done)


def test_the_export_read_back_with_pyarrow_is_the_trace_token_for_token(recording, tmp_path):
    import pyarrow.parquet as pq

    out = tmp_path / "session.parquet"
    done = replays.looptrace("export", "--store", str(recording.store), "--session", recording.session,
                             "--format", "parquet", "--out", str(out))
    assert done.returncode == 0, replays.outcome(done)
    rows = pq.read_table(out).to_pylist()
    traces = steps_of(recording)
    assert [r["trace_id"] for r in rows] == [t["trace_id"] for t in traces]
    for row, trace in zip(rows, traces):
        tokens = span(trace, "decode")["tokens"]
        assert row["prompt_ids"] == span(trace, "render")["attributes"][attr.PROMPT_IDS]
        assert row["completion_ids"] == [t["id"] for t in tokens]
        assert row["completion_logprobs"] == pytest.approx([t["logprob"] for t in tokens], abs=0)
    first, second = rows
    # The mask covers exactly the model's tokens: its answers, and step 1's answer where step 2's prompt holds it.
    assert first["mask"] == [0] * len(first["prompt_ids"]) + [1] * len(first["completion_ids"])
    at, length = len(first["prompt_ids"]), len(first["completion_ids"])
    prompt_mask = second["mask"][:len(second["prompt_ids"])]
    assert [i for i, m in enumerate(prompt_mask) if m] == list(range(at, at + length))
    assert second["prompt_ids"][at:at + length] == first["completion_ids"]
    assert second["mask"][len(second["prompt_ids"]):] == [1] * len(second["completion_ids"])
    assert [c["name"] for c in first["tool_calls"]] == ["exec_command"] and second["tool_calls"] == []
    lines = replays.looptrace("export", "--store", str(recording.store), "--session", recording.session)
    assert [json.loads(line)["completion_ids"] for line in lines.stdout.splitlines()] == \
        [r["completion_ids"] for r in rows]


def test_the_compare_page_shows_both_sides_with_the_divergent_tokens_marked(recording, other, reports, tmp_path):
    from browser import Page, chromium

    _, report, _ = replays.replay(recording.store, recording.session, other.url, reports, "forced", name="shown")
    first = report["first_divergence"]
    assert first is not None
    with chromium() as browser:
        page = Page(browser, width=1400, height=1000)
        page.page.goto(recording.server.url + report["compare_path"])
        page.page.locator("#key-input").fill(replays.API_KEY)  # the server has a key: the page asks for it
        page.page.locator("#key-form button[type=submit]").click()
        page.page.locator(".compare-summary").wait_for(timeout=60_000)  # (the page's CSP forbids wait_for_function's eval)
        pair = page.page.locator("li.pair").nth(first["step"] - 1)
        columns = pair.locator(".col")
        assert columns.count() == 2
        for side in range(2):
            marked = columns.nth(side).locator(".tok.diverged")
            assert marked.first.get_attribute("data-i") == str(first["token"])
        summary = page.page.locator(".compare-summary").inner_text()
        assert f"step {first['step']}, token {first['token']}" in summary
        page.page.screenshot(path=str(tmp_path / "compare.png"))
        # No script failed; the one refused request is the first, before the key was given.
        assert not page.errors and all("401" in m for m in page.console), (page.errors, page.console)


def atif_export(recording) -> dict:
    import atif

    done = replays.looptrace("export", "--store", str(recording.store), "--session", recording.session, "--format",
                             "atif")
    assert done.returncode == 0, replays.outcome(done)
    (line,) = done.stdout.splitlines()
    document = json.loads(line)
    atif.Trajectory.model_validate(document)
    return document


def test_the_atif_export_is_codexs_session_with_the_traces_ids_and_logprobs(recording):
    document = atif_export(recording)
    assert document["agent"]["name"] == "codex_exec" and document["agent"]["model_name"] == replays.MODEL
    assert "exec_command" in [t["function"]["name"] for t in document["agent"]["tool_definitions"]]
    assert any(tiny_agent.PROMPT in json.dumps(s["message"]) for s in document["steps"] if s["source"] == "user")
    agent = [s for s in document["steps"] if s["source"] == "agent"]
    traces = steps_of(recording)
    assert [s["extra"]["trace_id"] for s in agent] == [t["trace_id"] for t in traces]
    for step, trace in zip(agent, traces):
        tokens = span(trace, "decode")["tokens"]
        # Equal, not close: the export copies the stored numbers, no arithmetic on any CPU.
        assert step["metrics"]["prompt_token_ids"] == span(trace, "render")["attributes"][attr.PROMPT_IDS]
        assert step["metrics"]["completion_token_ids"] == [t["id"] for t in tokens]
        assert step["metrics"]["logprobs"] == [t["logprob"] for t in tokens]
    (call,) = agent[0]["tool_calls"]
    assert (call["function_name"], call["arguments"], call["extra"]["outcome"]) == \
        ("exec_command", {"cmd": tiny_agent.COMMAND}, "valid")
    (result,) = agent[0]["observation"]["results"]  # what codex sent back: the command's output
    assert result["source_call_id"] == call["tool_call_id"] and result["content"]
    assert agent[1]["message"] == tiny_agent.ANSWER and "tool_calls" not in agent[1]


PHOENIX_IMPORT = """
import json, sys, time
import httpx
from phoenix.client import Client
from phoenix.client.helpers.atif import upload_atif_trajectories_as_spans
client = Client(base_url=sys.argv[1])
upload_atif_trajectories_as_spans(client, [json.load(open(sys.argv[2]))], project_name="atif")
spans = []
for _ in range(120):  # Phoenix queues what it receives and writes it (and makes the project) a moment later
    try:
        spans = client.spans.get_spans(project_identifier="atif", limit=1000)
    except httpx.HTTPStatusError as exc:
        if exc.response.status_code != 404:
            raise
    if sum(s["span_kind"] == "LLM" for s in spans) >= int(sys.argv[3]):
        break
    time.sleep(0.5)
print(json.dumps(spans, default=str))
"""


def test_phoenix_imports_the_atif_export(recording, tmp_path):
    from phoenix import Phoenix, phoenix_binary

    document = atif_export(recording)
    path = tmp_path / "trajectory.json"
    path.write_text(json.dumps(document))
    phoenix = Phoenix(tmp_path / "phoenix")
    try:
        phoenix.wait_ready()
        calls = sum(s["source"] == "agent" and "metrics" in s for s in document["steps"])
        done = subprocess.run([str(phoenix_binary().parent / "python"), "-c", PHOENIX_IMPORT, phoenix.url, str(path),
                               str(calls)], capture_output=True, text=True, timeout=300)
    finally:
        phoenix.stop()
    assert done.returncode == 0, done.stderr[-3000:]
    spans = json.loads(done.stdout)
    llm = sorted((s for s in spans if s["span_kind"] == "LLM"), key=lambda s: s["start_time"])
    agent = [s for s in document["steps"] if s["source"] == "agent"]
    # Phoenix's own converter (phoenix.client.helpers.atif, for ATIF up to v1.7: it warns of v1.8 and reads it)
    # made an LLM span of each model call, with its token counts, and a TOOL span of the call.
    assert [s["attributes"]["llm.token_count.prompt"] for s in llm] == [s["metrics"]["prompt_tokens"] for s in agent]
    assert {s["attributes"]["session.id"] for s in spans} == {recording.session}
    assert [s["name"] for s in spans if s["span_kind"] == "TOOL"] == ["exec_command"]
