"""Rollouts for agent RL (issue 36): a rollout's base URL, token continuity (check classifies every
turn, keep builds each prompt of the ids the model read and sampled), vLLM's token extensions, rewards,
the trainer's logprobs and the gap, and the trainer formats of `looptrace export`. What the engine
read is taken from the backend itself (a wrapper that keeps each DecodeRequest's prompt ids)."""

from __future__ import annotations

import json
import math
import urllib.request

import pytest

from looptrace.common import attributes as attr
from looptrace.proxy.api.keys import TELEMETRY
from looptrace.proxy.export.rollouts import rollout_rows
from looptrace.proxy.settings import Settings
from looptrace.trace_store.gap import figures
from looptrace.trace_store.recorded_sessions import session_steps

from app_thread import AppThread, Reading

CALL = ("<tool_call>\n<function=read_file>\n<parameter=path>\nnotes.txt\n</parameter>\n</function>\n</tool_call>"
        "<|im_end|>")
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}}}}]
ANSWERS = ("Let me  read it.\n</think>\n\n" + CALL, "It says   hi.\n</think>\n\nIt says hi.<|im_end|>",
           "Done.\n</think>\n\nOK.<|im_end|>")


def text(app: AppThread, path: str) -> str:
    with urllib.request.urlopen(app.url + path, timeout=30) as response:
        return response.read().decode()


def stream(app: AppThread, path: str, body: dict) -> list[dict]:
    """The chunks of a streamed answer."""
    request = urllib.request.Request(app.url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        lines = response.read().decode().splitlines()
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]


@pytest.fixture(scope="module")
def app(qwen3_5_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("rollouts")
    placeholder = folder / "none.jsonl"
    placeholder.write_text('{"text": "unused"}\n')
    running = AppThread(Settings(model=str(qwen3_5_dir), backend="replay", replay=str(placeholder),
                                 served_model_name="tiny", trace_db=str(folder / "traces.sqlite3"),
                                 token_continuity="check")).start()
    yield running
    running.stop()


def agent(app: AppThread, rollout: str, mode: str | None, *, edit_answer: bool = False, turns: int = 3,
          headers: dict | None = None) -> tuple[Reading, list[dict]]:
    """A three-turn agent loop (a tool call, its result, an answer, a new user message) through
    /r/{rollout}/v1; each answer with its ids (return_token_ids)."""
    backend = Reading(app.replay(*ANSWERS[:turns]))
    app.runtime.backend = backend
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "Read notes.txt"}]
    answers = []
    for turn in range(turns):
        body = {"model": "tiny", "messages": messages, "tools": TOOLS, "return_token_ids": True, "logprobs": True}
        if mode:
            body["token_continuity"] = mode
        status, answer = app.call("POST", f"/r/{rollout}/v1/chat/completions", body, headers)
        assert status == 200, answer
        answers.append(answer)
        message = {k: v for k, v in answer["choices"][0]["message"].items()
                   if k in ("role", "content", "tool_calls", "reasoning_content")}
        if edit_answer and turn == 1:
            message["content"] = "Something the model never said."
        messages = messages + [message]
        if message.get("tool_calls"):
            messages.append({"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "hello"})
        else:
            messages.append({"role": "user", "content": "thanks"})
    return backend, answers


def continuity_of(app: AppThread, rollout: str, steps: int) -> list[str | None]:
    session = app.stored(f"/v1/sessions/{rollout}")
    while len(session["steps"]) < steps:
        session = app.stored(f"/v1/sessions/{rollout}")
    found = []
    for step in session["steps"]:
        trace = app.stored(f"/v1/traces/{step['trace_id']}")
        render = next(s for s in trace["spans"] if s["name"] == attr.SPAN_RENDER)["attributes"]
        found.append(render.get(attr.PROMPT_CONTINUITY))
    return found


def test_keep_makes_every_prompt_the_previous_prompt_and_the_sampled_ids(app):
    backend, answers = agent(app, "keep-1", "keep")
    for before, read in zip(answers, backend.read[1:]):
        held = before["prompt_token_ids"] + before["choices"][0]["token_ids"]
        assert read[:len(held)] == held  # what the engine read, not looptrace's record
    # Without keep, the third prompt drops the first answer's reasoning (a new user message came).
    assert continuity_of(app, "keep-1", 3) == [None, "kept", "kept"]
    backend, answers = agent(app, "check-1", None)
    third = backend.read[2]
    held = answers[1]["prompt_token_ids"] + answers[1]["choices"][0]["token_ids"]
    assert third[:len(held)] != held
    assert continuity_of(app, "check-1", 3) == [None, "clean", "realign"]


def test_check_classifies_an_edited_history_as_a_fork_and_counts_every_class(app):
    agent(app, "fork-1", "check", edit_answer=True)
    assert continuity_of(app, "fork-1", 3) == [None, "clean", "fork"]
    exposition = text(app, "/metrics")
    for kind in ("clean", "realign", "fork", "kept"):
        assert f'looptrace_token_continuity_total{{class="{kind}",model="tiny"}}' in exposition


def test_the_ids_answered_are_those_the_engine_read_and_wrote_streamed_or_not(app):
    backend, answers = agent(app, "ids-1", "off", turns=1)
    answer = answers[0]
    choice = answer["choices"][0]
    assert answer["prompt_token_ids"] == backend.read[0]
    assert len(choice["token_ids"]) == len(choice["logprobs"]["content"]) > 0
    app.runtime.backend = backend = Reading(app.replay(ANSWERS[0]))
    chunks = stream(app, "/v1/chat/completions", {
        "model": "tiny", "messages": [{"role": "user", "content": "Read notes.txt"}], "tools": TOOLS, "stream": True,
        "return_token_ids": True, "logprobs": True, "return_tokens_as_token_ids": True})
    assert chunks[0]["prompt_token_ids"] == backend.read[0]
    assert "token_ids" not in chunks[0]["choices"][0]  # vLLM's opening chunk has none: its ids are the prompt's
    assert all("prompt_token_ids" not in c for c in chunks[1:])
    ids = [i for c in chunks for choice in c["choices"] for i in choice.get("token_ids") or []]
    entries = [e for c in chunks for choice in c["choices"] for e in (choice.get("logprobs") or {}).get("content", [])]
    assert ids == choice["token_ids"]  # the same recorded answer: the same ids
    assert [e["token"] for e in entries] == [f"token_id:{i}" for i in ids]


RESPONSES = {"model": "tiny", "input": "Read notes.txt", "tools": [{"type": "function", "name": "read_file",
                                                                   "parameters": TOOLS[0]["function"]["parameters"]}]}
MESSAGES = {"model": "tiny", "max_tokens": 64, "messages": [{"role": "user", "content": "Read notes.txt"}],
            "tools": [{"name": "read_file", "input_schema": TOOLS[0]["function"]["parameters"]}]}


def test_responses_give_the_ids_read_and_written_as_vllms_enable_response_messages_does(app):
    """vLLM 0.32's Responses field: `input_messages` and `output_messages`, each one raw message (its text
    and ids), in the response object: the non-streamed answer's, and the stream's response.completed."""
    tokenizer = app.runtime.tokenizer
    for streamed in (False, True):
        app.runtime.backend = backend = Reading(app.replay(ANSWERS[0]))
        body = {**RESPONSES, "enable_response_messages": True, "stream": streamed}
        if streamed:
            events = stream(app, "/v1/responses", body)
            (response,) = [e["response"] for e in events if e["type"] == "response.completed"]
            assert all("input_messages" not in e.get("response", {}) for e in events if e is not events[-1])
        else:
            status, response = app.call("POST", "/v1/responses", body)
            assert status == 200, response
        assert response["output"][-1]["type"] == "function_call"  # the call parsed as always
        (read,), (wrote,) = response["input_messages"], response["output_messages"]
        assert read == {"message": tokenizer.decode(backend.read[0]), "tokens": backend.read[0],
                        "type": "raw_message_tokens"}
        assert wrote == {"message": tokenizer.decode(backend.wrote[0], skip_special_tokens=True),
                         "tokens": backend.wrote[0], "type": "raw_message_tokens"}
    app.replay(ANSWERS[0])
    status, response = app.call("POST", "/v1/responses", RESPONSES)
    assert status == 200 and "input_messages" not in response and "output_messages" not in response
    status, error = app.call("POST", "/v1/responses", {**RESPONSES, "enable_response_messages": "yes"})
    assert status == 400 and error["error"]["param"] == "enable_response_messages"


def test_messages_give_the_ids_read_and_written_with_return_token_ids(app):
    """Anthropic's Messages, which vLLM gives no ids: `return_token_ids` (an extra body key to the SDKs)
    puts `prompt_token_ids` and `token_ids` on the message; streamed, the prompt's on message_start's
    message and the answer's, whole, on message_delta."""
    for streamed in (False, True):
        app.runtime.backend = backend = Reading(app.replay(ANSWERS[0]))
        body = {**MESSAGES, "return_token_ids": True, "stream": streamed}
        if streamed:
            events = stream(app, "/v1/messages", body)
            (start,) = [e["message"] for e in events if e["type"] == "message_start"]
            (delta,) = [e for e in events if e["type"] == "message_delta"]
            answer = {"prompt_token_ids": start["prompt_token_ids"], "token_ids": delta["token_ids"]}
            assert sum("token_ids" in json.dumps(e) for e in events) == 2
        else:
            status, answer = app.call("POST", "/v1/messages", body)
            assert status == 200 and answer["content"][-1]["type"] == "tool_use", answer
        assert answer["prompt_token_ids"] == backend.read[0] and answer["token_ids"] == backend.wrote[0]
    app.replay(ANSWERS[0])
    status, answer = app.call("POST", "/v1/messages", MESSAGES)
    assert status == 200 and "token_ids" not in answer and "prompt_token_ids" not in answer
    status, error = app.call("POST", "/v1/messages", {**MESSAGES, "return_token_ids": 1})
    assert status == 400 and error["type"] == "error" and "return_token_ids" in error["error"]["message"]


def test_a_rollout_is_a_session_its_group_a_filter_and_its_id_is_bounded(app):
    agent(app, "grouped-1", "off", turns=1, headers={"X-Rollout-Group": "task-7"})
    agent(app, "grouped-2", "off", turns=1, headers={"X-Rollout-Group": "task-8"})
    app.stored("/v1/sessions/grouped-1")
    listed = app.stored("/v1/rollouts?group=task-7")["data"]
    assert [r["rollout"] for r in listed] == ["grouped-1"]
    sessions = app.stored("/v1/sessions?group=task-8")["data"]
    assert [s["key"] for s in sessions] == ["grouped-2"]
    status, error = app.call("POST", "/r/bad%01id/v1/chat/completions", {"model": "tiny", "messages": [
        {"role": "user", "content": "hi"}]})
    assert status == 400 and error["error"]["param"] == "rollout_id"
    status, error = app.call("POST", "/r/x/v1/messages", {"model": "tiny"})
    assert status == 400 and error["type"] == "error"  # Anthropic's error shape under the rollout's base URL too
    status, error = app.call("POST", "/v1/chat/completions", {"model": "tiny", "messages": [
        {"role": "user", "content": "hi"}], "token_continuity": "sometimes"})
    assert status == 400 and error["error"]["param"] == "token_continuity"


def test_a_reward_for_the_rollout_and_per_step_reads_back_and_bad_ones_are_refused(app):
    agent(app, "reward-1", "keep", turns=2)
    status, found = app.call("POST", "/v1/rollouts/reward-1/reward", {
        "reward": 1.0, "info": {"passed": True}, "steps": [{"step": 2, "reward": 0.5}]})
    assert status == 200, found
    assert app.call("GET", "/v1/rollouts/reward-1/reward")[1] | {"updated_ns": 0} == {
        "rollout": "reward-1", "group": None, "reward": 1.0, "info": {"passed": True}, "updated_ns": 0,
        "steps": [{"step": 2, "reward": 0.5, "info": None}]}
    for body, param in (({"reward": math.inf}, "reward"), ({}, "reward"), ({"steps": [{"reward": 1}]}, "steps[0]"),
                        ({"reward": 1, "info": []}, "info")):
        status, error = app.call("POST", "/v1/rollouts/reward-1/reward", json.loads(json.dumps(body)))
        assert status == 400 and error["error"]["param"] == param, (body, error)
    assert app.call("GET", "/v1/rollouts/nobody/reward")[0] == 404


def test_the_recorded_logprobs_uploaded_as_the_trainers_give_no_gap_and_others_do(app):
    agent(app, "gap-1", "keep", turns=2)
    session = app.stored("/v1/sessions/gap-1", steps=2)
    tokens = [app.stored(f"/v1/traces/{s['trace_id']}/tokens")["tokens"] for s in session["steps"]]
    recorded = [t["logprob"] for step in tokens for t in step]
    status, gap = app.call("POST", "/v1/rollouts/gap-1/trainer-logprobs", {"logprobs": recorded})
    assert status == 200, gap
    assert gap["kl_k3"] == 0 and gap["past_cap"] == 0 and gap["tokens"] == len(recorded)
    shifted = [{"step": 1, "logprobs": [lp - 0.1 for lp in (t["logprob"] for t in tokens[0])]},
               {"step": 2, "logprobs": [lp - (2.0 if n == 3 else 0.1) for n, lp in
                                        enumerate(t["logprob"] for t in tokens[1])]}]
    status, gap = app.call("POST", "/v1/rollouts/gap-1/trainer-logprobs", {"steps": shifted,
                                                                            "weight_version": "step-3"})
    assert status == 200, gap
    # The replay backend's tokens have p = 1: the trainer can only find them less likely (ratios below 1).
    assert gap["kl_k3"] > 0 and gap["past_cap"] == 0
    worst = gap["worst"][0]
    assert (worst["step"], worst["index"]) == (2, 3) and worst["log_ratio"] == pytest.approx(-2.0)
    assert all(step["weight_version"] == "step-3" for step in gap["steps"])
    status, error = app.call("POST", "/v1/rollouts/gap-1/trainer-logprobs", {"logprobs": recorded[:-1]})
    assert status == 400 and error["error"]["param"] == "logprobs"
    assert app.call("GET", "/v1/rollouts/gap-1/gap?cap=1")[0] == 400


def test_k3_and_the_share_past_the_cap_are_those_of_truncated_importance_sampling():
    inference = [-1.0, -2.0, -0.5, -3.0]
    trainer = [-1.0, -1.0, -0.5, -3.0 - math.log(3)]  # ratios 1, e, 1, 1/3
    found = figures(inference, trainer, cap=2.0)
    ratios = [1.0, math.e, 1.0, 1 / 3]
    assert found["kl_k3"] == pytest.approx(sum(r - 1 - math.log(r) for r in ratios) / 4)
    assert found["past_cap"] == 0.25 and found["tokens"] == 4
    assert figures(inference, inference)["kl_k3"] == 0


def test_a_kept_rollout_exports_as_one_trajectory_in_every_trainers_format(app):
    backend, answers = agent(app, "export-1", "keep")
    app.call("POST", "/v1/rollouts/export-1/reward", {"reward": 2.0})
    app.stored("/v1/sessions/export-1", steps=3)
    store = app.runtime.settings.trace_db
    steps = session_steps(app.app[TELEMETRY].store, "export-1")
    (row,) = rollout_rows([("export-1", steps)], "verl", "rollout", store)
    sampled = [a["choices"][0]["token_ids"] for a in answers]
    assert row["prompt_ids"] == backend.read[0] and row["reward_score"] == 2.0 and row["num_turns"] == 6
    whole = row["prompt_ids"] + row["response_ids"]
    assert whole[:len(backend.read[2])] == backend.read[2]
    model_ids = [i for i, m in zip(row["response_ids"], row["response_mask"]) if m]
    assert model_ids == [i for ids in sampled for i in ids]
    assert [s["continuity"] for s in row["looptrace"]["steps"]] == [None, "kept", "kept"]
    assert row["looptrace"]["tokenizer_sha256"] and row["looptrace"]["template_sha256"]
    per_step = rollout_rows([("export-1", steps)], "nemo-gym", "step", store)
    assert [r["output"][0]["generation_token_ids"] for r in per_step] == sampled
    (datum,) = rollout_rows([("export-1", steps)], "tinker", "rollout", store)
    inputs = datum["loss_fn_inputs"]
    assert datum["model_input"]["chunks"][0]["tokens"] == whole[:-1] and inputs["target_tokens"]["data"] == whole[1:]
    assert sum(inputs["mask"]["data"]) == len(model_ids)


def test_the_template_check_is_in_health(app):
    continuity = app.call("GET", "/health")[1]["token_continuity"]
    assert continuity["mode"] == "check" and continuity["template"]["prefix_preserving"] is False
    assert any("new user message" in r for r in continuity["template"]["rewrites"])
