"""The real Claude Code (`@anthropic-ai/claude-code` from npm) against a real `looptrace serve`, through
/v1/messages, end to end, set up as docs/clients.md says.

With the replay backend the tiny Qwen3.5 checkpoint "writes" recorded Qwen3.5-format output, so
Claude Code is driven deterministically through a tool call: `claude -p` with permission for Bash
runs the command, sends its result back, and prints the final answer; the session is then read from
the viewer's API with its two steps. Under strace, every socket it opened went to looptrace: no
telemetry, update check or DNS lookup of Anthropic's hosts. Against SmolLM2-135M-Instruct (llama.cpp)
it gets a real model's answer. A recording proxy between client and server keeps what it sent.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

import clients
from messages_api import qwen_call

API_KEY = "sk-looptrace-test"
MODEL = "qwen3.5-tiny"
ANSWER = "The command printed looptrace-ok."


def strace_log(tmp_path):
    """Where strace writes Claude Code's connects; None (the check skipped) where strace is missing,
    except in CI, which installs it (tests/run.sh)."""
    if shutil.which("strace") is None:
        assert not os.environ.get("CI"), "strace is missing: tests/run.sh installs it"
        return None
    return tmp_path / "connects.txt"


def outcome(process) -> str:
    return f"exit {process.returncode}\nstdout:\n{process.stdout[-4000:]}\nstderr:\n{process.stderr[-4000:]}"


def test_claude_code_runs_a_tool_and_answers(installed, serve, qwen3_5_dir, tmp_path):
    steps = tmp_path / "steps.jsonl"
    steps.write_text("".join(json.dumps({"text": s}) + "\n" for s in (
        "I will run it.\n</think>\n\n" + qwen_call("Bash", command="echo looptrace-ok", description="Print a word")
        + "<|im_end|>",
        "It worked.\n</think>\n\n" + ANSWER + "<|im_end|>")))
    server = serve(str(qwen3_5_dir), "--backend", "replay", "--replay", str(steps), "--served-model-name", MODEL,
                   api_key=API_KEY)
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    connects = strace_log(tmp_path)
    with clients.RecordingProxy(server.url) as proxy:
        env = clients.claude_env(home, f"http://127.0.0.1:{proxy.port}", API_KEY, MODEL)
        done = clients.run_claude(installed, env, work, MODEL, "Run echo looptrace-ok", "--allowedTools", "Bash",
                                  connections=connects)
    assert done.returncode == 0, outcome(done)
    # Its later turns were encoded from its first and checked against whole encodings (conftest.py).
    assert server.metric("looptrace_render_checks_total", result="same") >= 1
    result = json.loads(done.stdout)
    assert (result["result"], result["num_turns"], result["is_error"]) == (ANSWER, 2, False), outcome(done)
    if connects is not None:
        assert clients.connected_to(connects) == {f"127.0.0.1:{proxy.port}"}

    first, second = proxy.requests
    assert (first["method"], first["path"]) == ("POST", "/v1/messages")  # nothing else first
    assert first["headers"]["x-api-key"] == API_KEY and first["body"]["stream"] is True
    session = first["headers"]["X-Claude-Code-Session-Id"]
    assert second["headers"]["X-Claude-Code-Session-Id"] == session == result["session_id"]
    assert "Bash" in [t["name"] for t in first["body"]["tools"]]
    assistant, user = second["body"]["messages"][-2:]
    thinking, call = assistant["content"]
    assert (thinking["type"], thinking["thinking"]) == ("thinking", "I will run it.") and thinking["signature"]
    assert (call["type"], call["name"], call["input"]) == ("tool_use", "Bash", {"command": "echo looptrace-ok",
                                                                                "description": "Print a word"})
    (tool_result,) = user["content"]
    assert tool_result["tool_use_id"] == call["id"] and "looptrace-ok" in json.dumps(tool_result["content"])

    # The session in the viewer, step by step.
    def both_stored() -> bool:
        status, found = server.get(f"/v1/sessions/{session}")
        return status == 200 and len(found["steps"]) == 2

    server.wait_until(both_stored, 15)
    _, found = server.get(f"/v1/sessions/{session}")
    assert (found["client"], found["client_version"]) == ("claude-cli", installed_version())
    asked, answered = found["steps"]
    assert asked["endpoint"] == answered["endpoint"] == "messages"
    assert [(t["name"], t["outcome"]) for t in asked["tool_calls"]] == [("Bash", "valid")]
    assert asked["finish_reason"] == "tool_calls" and answered["finish_reason"] == "stop"
    (response,) = [p for m in answered["new_messages"] for p in m["parts"] if p["type"] == "tool_call_response"]
    assert response["id"] == call["id"] and "looptrace-ok" in response["response"]
    assert answered["output"][0]["parts"][-1] == {"type": "text", "content": ANSWER}


def installed_version() -> str:
    return clients.CLAUDE_CODE.rsplit("@", 1)[1]


@pytest.fixture(scope="module")
def smollm2(serve, smollm2_gguf_path, tmp_path_factory):
    # One thread: llama.cpp's threads meet at spinning barriers every layer, so two threads on two
    # cores collapse as soon as another process wants one (Claude Code's node beside it; measured on a
    # busy machine: 2.1 tokens/s decoding with two threads against 16.5 with one).
    # Greedy: Claude Code sends no temperature, and SmolLM2 sampled at its family's defaults (0.7)
    # now and then rambled to max_tokens, and Claude Code asked it to go on, again and again, past
    # the test's time. The GGUF's tokenizer and config saved as a folder with a generation config
    # that asks for greedy decoding (the checkpoint's own setting, as a user would give it).
    from transformers import AutoConfig, AutoTokenizer

    folder, name = smollm2_gguf_path.parent, smollm2_gguf_path.name
    tokenizer = tmp_path_factory.mktemp("smollm2-greedy")
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(tokenizer)
    AutoConfig.from_pretrained(folder, gguf_file=name).save_pretrained(tokenizer)
    (tokenizer / "generation_config.json").write_text(json.dumps({"do_sample": False}))
    return serve(str(smollm2_gguf_path), "--backend", "llama.cpp", "--tokenizer", str(tokenizer),
                 "--served-model-name", "smollm2", "--max-model-len", "8192", "--threads", "1", api_key=API_KEY)


# A system prompt of our own: with Claude Code's (4,000 tokens of instructions a 135M model cannot
# follow) SmolLM2 rambled to max_tokens, Claude Code asked it to go on and then to summarize, each a
# prefill of 4-6 K tokens: minutes on two busy cores, past the test's time. Its whole prompt goes
# through the tiny Qwen3.5 in test_claude_code_runs_a_tool_and_answers.
SYSTEM = "You are a helpful assistant. Answer in one short sentence."


def test_claude_code_gets_an_answer_from_smollm2(installed, smollm2, tmp_path):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    with clients.RecordingProxy(smollm2.url) as proxy:
        env = clients.claude_env(home, f"http://127.0.0.1:{proxy.port}", API_KEY, "smollm2", context=8192,
                                 max_tokens=512)
        done = clients.run_claude(installed, env, work, "smollm2", "What is the capital of France?",
                                  "--system-prompt", SYSTEM, timeout=300)
    assert done.returncode == 0, outcome(done)
    result = json.loads(done.stdout)
    assert result["result"].strip() and not result["is_error"], outcome(done)
    assert result["usage"]["input_tokens"] > 0 and result["usage"]["output_tokens"] > 0
    first = next(r for r in proxy.requests if r["path"] == "/v1/messages")["body"]
    assert first["model"] == "smollm2" and first["max_tokens"] == 512
    assert SYSTEM in json.dumps(first["system"])
    # A rambling sample may run into max_tokens, and Claude Code asks it to go on: still the same question.
    assert all(r["path"] == "/v1/messages" for r in proxy.requests) and len(proxy.requests) <= 4


SUBAGENT_ANSWER = "The subagent found sub-ok."
LEAD_ANSWER = "The subagent said sub-ok."


def test_claude_codes_subagent_exports_as_an_atif_trajectory_linked_from_its_agent_call(installed, serve, qwen3_5_dir,
                                                                                       tmp_path):
    """Claude Code's Agent tool run in the foreground: the lead's call, the subagent's request (its own
    messages, x-claude-code-agent-id, the lead's session), the lead's answer to the subagent's report."""
    import atif

    from server import looptrace_command

    steps = tmp_path / "steps.jsonl"
    steps.write_text("".join(json.dumps({"text": s}) + "\n" for s in (
        "Delegating.\n</think>\n\n" + qwen_call("Agent", description="Find a word", prompt="Run echo sub-ok",
                                               subagent_type="general-purpose", run_in_background="false")
        + "<|im_end|>",
        "Searching.\n</think>\n\n" + SUBAGENT_ANSWER + "<|im_end|>",
        "Reported.\n</think>\n\n" + LEAD_ANSWER + "<|im_end|>")))
    server = serve(str(qwen3_5_dir), "--backend", "replay", "--replay", str(steps), "--served-model-name", MODEL,
                   api_key=API_KEY)
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    with clients.RecordingProxy(server.url) as proxy:
        env = clients.claude_env(home, f"http://127.0.0.1:{proxy.port}", API_KEY, MODEL)
        done = clients.run_claude(installed, env, work, MODEL, "Ask a subagent for the word", "--allowedTools", "Agent",
                                  timeout=180)
    assert done.returncode == 0 and json.loads(done.stdout)["result"] == LEAD_ANSWER, outcome(done)
    lead, sub, answered = proxy.requests
    session = lead["headers"]["X-Claude-Code-Session-Id"]
    agent_id = sub["headers"]["x-claude-code-agent-id"]
    assert sub["headers"]["X-Claude-Code-Session-Id"] == session and "x-claude-code-agent-id" not in answered["headers"]
    server.wait_until(lambda: len(server.get(f"/v1/sessions/{session}")[1].get("steps", [])) == 3, 15)

    exported = subprocess.run([*looptrace_command(), "export", "--store", str(server.trace_db), "--session", session,
                               "--format", "atif"], capture_output=True, text=True, timeout=300)
    assert exported.returncode == 0, exported.stderr
    document = json.loads(exported.stdout)
    atif.Trajectory.model_validate(document)
    assert (document["agent"]["name"], document["agent"]["version"]) == ("claude-cli", installed_version())
    first, last = [s for s in document["steps"] if s["source"] == "agent"]
    (call,) = first["tool_calls"]
    assert (call["function_name"], call["arguments"]["prompt"]) == ("Agent", "Run echo sub-ok")
    (result,) = first["observation"]["results"]  # the subagent's report, as Claude Code returned it to the lead
    assert result["source_call_id"] == call["tool_call_id"] and SUBAGENT_ANSWER in result["content"]
    assert result["subagent_trajectory_ref"] == [{"trajectory_id": agent_id, "session_id": session}]
    assert last["message"] == LEAD_ANSWER
    (child,) = document["subagent_trajectories"]
    assert child["trajectory_id"] == agent_id  # (Claude Code 2.1.332 sent no agent type for it)
    assert any("Run echo sub-ok" in json.dumps(s["message"]) for s in child["steps"] if s["source"] == "user")
    (child_answer,) = [s for s in child["steps"] if s["source"] == "agent"]
    assert child_answer["message"] == SUBAGENT_ANSWER
    # The session's agent tree: the subagent under the lead's step whose Agent call spawned it.
    tree = server.get(f"/v1/sessions/{session}")[1]
    lead_agent, sub_agent = tree["agents"]
    assert lead_agent["parent"] is None and (sub_agent["id"], sub_agent["parent"]) == (agent_id, lead_agent["id"])
    assert [s["agent"] for s in tree["steps"]] == [lead_agent["id"], agent_id, lead_agent["id"]]
    spawning = tree["steps"][0]
    assert sub_agent["spawned_by"] == {"trace_id": spawning["trace_id"], "tool_call_id": spawning["tool_calls"][0]["id"]}
    for step in (first, child_answer, last):  # each model call's numbers, as stored
        _, trace = server.get(f"/v1/traces/{step['extra']['trace_id']}")
        spans = {s["name"]: s for s in trace["spans"]}
        # Equal, not close: the export copies the stored numbers, no arithmetic on any CPU.
        assert step["metrics"]["prompt_token_ids"] == spans["render"]["attributes"]["looptrace.prompt.ids"]
        assert step["metrics"]["completion_token_ids"] == [t["id"] for t in spans["decode"]["tokens"]]
        assert step["metrics"]["logprobs"] == [t["logprob"] for t in spans["decode"]["tokens"]]
