"""The replay's parts in this process: the comparisons (proxy/replay/figures.py), the reports (JSON,
JUnit read back by junitparser), the export's mask, and a whole forced and step replay against the
application serving the tiny Qwen3.5 here, stored as a session the compare endpoint reads back."""

from __future__ import annotations

import argparse
import json

import junitparser
import pytest

from looptrace.common import attributes as attr
from looptrace.proxy.export import command as export
from looptrace.proxy.replay import figures as compare
from looptrace.proxy.replay import run as command
from looptrace.proxy.replay.report import write_junit
from looptrace.trace_store.recorded_sessions import Recorded

from waiting import wait_until

HEADERS = {"session_id": "replay-unit", "User-Agent": "pytest-replay/1"}


def token(i: int, token_id: int, top: int, logprob: float, channel: str = "content", piece: str = "x") -> dict:
    return {"index": i, "id": token_id, "top_ids": [top], "logprob": logprob, "channel": channel, "piece": piece}


def scored(token_id: int, greedy: int, logprob: float) -> dict:
    return {"id": token_id, "logprob": logprob, "rank": 1 if greedy == token_id else 2, "greedy_id": greedy,
            "greedy_logprob": logprob}


def test_forced_compares_the_two_models_greedy_choices():
    # A sampled recording: token 1 was not the recording model's greedy choice (5 was), and the target
    # would also have chosen 5 there: they agree. At token 2 the target would have chosen otherwise.
    recorded = Recorded(1, "a" * 32, "b" * 16, "m", tokens=[
        token(0, 10, 10, -0.1), token(1, 11, 5, -2.0), token(2, 12, 12, -0.2, "tool_call"), token(3, 13, 13, -0.3, "tool_call")])
    scores = [scored(10, 10, -0.1), scored(11, 5, -2.5), scored(12, 7, -1.0), scored(13, 13, -0.3)]
    result = compare.forced(recorded, scores)
    assert (result["tokens"], result["agreeing"], result["first_divergence"]) == (4, 3, 2)
    assert result["mean_logprob_recorded"] == pytest.approx(-2.6 / 4)
    assert result["mean_logprob_target"] == pytest.approx(-3.9 / 4)
    assert result["max_logprob_difference"] == pytest.approx(0.8)
    assert (result["tool_call_tokens"], result["tool_call_agreeing"]) == (2, 1)
    assert result["mean_logprob_target_tool_calls"] == pytest.approx(-0.65)
    assert result["divergence"] | {"target_greedy_piece": None} == {
        "recorded_id": 12, "recorded_piece": "x", "recording_greedy_id": 12, "target_greedy_id": 7,
        "target_greedy_piece": None}


def test_step_mode_compares_calls_as_json_with_their_outcomes():
    call = {"name": "f", "arguments": '{"a": 1, "b": [2]}', "outcome": "valid"}
    assert compare.same_calls([call], [{**call, "arguments": '{"b":[2],"a":1}'}])  # JSON, not text
    assert not compare.same_calls([call], [{**call, "outcome": "invalid_args"}])
    assert not compare.same_calls([call], [call, call])
    assert compare.same_calls([{"outcome": "unparsed", "raw": "<tool_call>x"}], [{"outcome": "unparsed", "raw": "<tool_call>x"}])
    recorded = Recorded(1, "a" * 32, "b" * 16, "m", tokens=[token(0, 1, 1, -0.1), token(1, 2, 2, -0.1)],
                        calls=[call], finish_reason="tool_calls")
    same = compare.step(recorded, {"tokens": [token(0, 1, 1, -0.2), token(1, 2, 2, -0.2)], "tool_calls": [call],
                                   "finish_reason": "tool_calls"})
    assert (same["first_divergence"], same["agreeing"], same["tool_calls_equal"], same["acted_alike"]) == (None, 2, True, True)
    other = compare.step(recorded, {"tokens": [token(0, 1, 1, -0.2), token(1, 9, 9, -0.2), token(2, 3, 3, -1)],
                                    "tool_calls": [], "finish_reason": "stop"})
    assert (other["first_divergence"], other["agreeing"], other["tool_calls_equal"], other["acted_alike"]) == \
        (1, 1, False, False)
    figures = compare.session("step", [{"step": 1, **same}, {"step": 2, **other}, {"step": 3, "skipped": "why"}])
    assert figures == {"agreement": 0.5, "steps_agreeing": 1, "first_different_step": 2,
                       "first_divergence": {"step": 2, "token": 1}}


def test_junit_holds_whatever_a_model_wrote_and_a_parser_reads_it(tmp_path):
    hostile = 'x<y & "z"\x00\x1b\ud800'
    steps = [{"step": 1, "trace_id": "t1", "tokens": 3, "agreeing": 3, "first_divergence": None, "seconds": 0.5},
             {"step": 2, "trace_id": "t2", "tokens": 4, "agreeing": 2, "first_divergence": 1, "seconds": 0.25,
              "divergence": {"recorded_id": 5, "recorded_piece": hostile, "recording_greedy_id": 5,
                             "target_greedy_id": 6, "target_greedy_piece": "]]>"}},
             {"step": 3, "trace_id": "t3", "skipped": "it was recorded without content"}]
    report = {"session": hostile, "mode": "forced", "target": "http://t", "model": "m", "agreement": 5 / 7,
              "replay_session": "r", "started": "2026-12-02T00:00:00+00:00", "seconds": 1.0, "steps": steps}
    path = tmp_path / "report.xml"
    write_junit(report, str(path))
    suite = next(iter(junitparser.JUnitXml.fromfile(str(path))))
    assert (suite.tests, suite.failures, suite.skipped, suite.errors) == (3, 1, 1, 0)
    cases = list(suite)
    assert [bool(c.result) for c in cases] == [False, True, True]
    failure = cases[1].result[0]
    assert failure.message.startswith("token 1: the recording chose 5")
    assert "]]>" in failure.text and "x<y & \"z\"" in failure.text and "\\x00" in failure.text  # as repr shows it
    assert suite.name == "looptrace replay x<y & \"z\"⟨U+0000⟩⟨U+001B⟩⟨U+D800⟩"  # what XML cannot hold, as marks


def test_the_export_mask_marks_exactly_the_tokens_the_model_wrote():
    first = Recorded(1, "a" * 32, "", "m", prompt_ids=[1, 2, 3], tokens=[token(0, 7, 7, -0.1), token(1, 8, 8, -0.2)])
    # The next prompt holds the answer (7, 8) as it was written, then the tool's result and a new turn.
    second = Recorded(2, "b" * 32, "", "m", prompt_ids=[1, 2, 3, 7, 8, 4, 5], tokens=[token(0, 9, 9, -0.3)])
    # Then the template rewrote history: the first answer's second token is gone (reasoning dropped), and
    # the answer opens with a forced call prefix (the last prompt token, 6).
    third = Recorded(3, "c" * 32, "", "m", prompt_ids=[1, 2, 3, 7, 4, 5, 9, 6], forced=1, tokens=[token(0, 1, 1, -0.1)])
    skipped = Recorded(4, "d" * 32, "", "m", skipped="no content")
    rows = list(export.session_records("k", [first, second, skipped, third]))
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[0]["mask"] == [0, 0, 0, 1, 1]
    assert rows[1]["mask"] == [0, 0, 0, 1, 1, 0, 0] + [1]
    assert rows[2]["mask"] == [0, 0, 0, 1, 0, 0, 0, 0] + [1]  # 9 at place 6 is not where step 2 wrote it
    assert rows[1]["completion_logprobs"] == [-0.3]


# -- a whole replay in this process, against the application serving the tiny Qwen3.5 here --

@pytest.fixture(scope="module")
def recorded_session(local_app):
    messages = [{"role": "user", "content": "Count to three."}]
    for _ in range(2):
        status, answer = local_app.call("POST", "/v1/chat/completions", {
            "model": "tiny-qwen", "messages": messages, "max_tokens": 12, "temperature": 0,
            "chat_template_kwargs": {"enable_thinking": False}}, HEADERS)
        assert status == 200, answer
        messages += [{"role": "assistant", "content": answer["choices"][0]["message"]["content"]},
                     {"role": "user", "content": "Again."}]
    # The store writes a step a moment after its answer: wait for the second, as stored() does for a trace.
    session = wait_until(lambda: (found := local_app.stored("/v1/sessions/replay-unit")) and
                         len(found["steps"]) >= 2 and found, 10, every=0.05)
    assert len(session["steps"]) == 2
    return session


def replay_args(local_app, tmp_path, mode: str) -> argparse.Namespace:
    return argparse.Namespace(store=local_app.settings.trace_db, session="replay-unit", target=local_app.url,
                              mode=mode, report=str(tmp_path / f"{mode}.json"), junit=str(tmp_path / f"{mode}.xml"),
                              min_agreement=1.0, sampling="recorded", max_tokens=None, api_key=None, timeout=120)


@pytest.mark.parametrize("mode", ["forced", "step"])
def test_a_replay_against_the_same_model_agrees_and_is_stored_as_a_session(local_app, recorded_session, tmp_path,
                                                                          mode):
    args = replay_args(local_app, tmp_path, mode)
    assert command.run(args) == 0
    report = json.loads((tmp_path / f"{mode}.json").read_text())
    assert (report["agreement"], report["first_divergence"], report["spans_lost"]) == (1.0, None, 0)
    assert [s["trace_id"] for s in report["steps"]] == [s["trace_id"] for s in recorded_session["steps"]]
    replayed = local_app.stored(f"/v1/sessions/{report['replay_session']}")
    assert len(replayed["steps"]) == 2 and replayed["client"] == "looptrace-replay"
    trace = local_app.stored(f"/v1/traces/{replayed['steps'][0]['trace_id']}")
    root = next(s for s in trace["spans"] if attr.ENDPOINT in s["attributes"])
    assert root["attributes"][attr.REPLAY_MODE] == mode and root["attributes"][attr.REPLAY_STEP] == 1
    assert root["links"][0]["attributes"][attr.LINK] == "replay_of"
    # The compare endpoint aligns the two sessions and finds nothing diverging.
    status, both = local_app.call("GET", f"/v1/compare?a=replay-unit&b={report['replay_session']}")
    assert status == 200, both
    assert both["summary"]["steps_agreeing"] == both["summary"]["compared"] == 2
    assert all(p["prompt"]["same"] and not p["divergent"] for p in both["steps"])
    assert both["steps"][0]["replay"]["mode"] == mode
    assert [t["id"] for t in both["steps"][0]["tokens_b"]] == [t["id"] for t in both["steps"][0]["tokens_a"]]


def test_the_compare_endpoint_refuses_what_it_cannot_compare(local_app, recorded_session):
    status, error = local_app.call("GET", "/v1/compare?a=replay-unit&b=nothing-here")
    assert (status, error["error"]["param"], error["error"]["code"]) == (404, "b", "session_not_found")
    status, error = local_app.call("GET", "/v1/compare?a=replay-unit")
    assert (status, error["error"]["param"]) == (400, "b")
