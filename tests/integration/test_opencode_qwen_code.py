"""The real opencode (`opencode-ai`) and qwen-code (`@qwen-code/qwen-code`) from npm against a real
`looptrace serve`, through Chat Completions, each through a tool call.

With the replay backend the tiny Qwen3.5 checkpoint "writes" recorded Qwen3.5-format output: the
client runs its shell tool, sends the result back (a recording proxy keeps what it sent) and prints
the final answer. Under strace, every socket either opened went to looptrace (the setup docs/clients.md gives
turns off their update checks, model catalogues, plugin installs and usage statistics).
"""

from __future__ import annotations

import json
import os
import shutil


import clients
from messages_api import qwen_call

API_KEY = "sk-looptrace-test"
MODEL = "qwen3.5-tiny"
ANSWER = "The command printed looptrace-ok."


def replayed(serve, qwen3_5_dir, tmp_path, call: str):
    steps = tmp_path / "steps.jsonl"
    steps.write_text("".join(json.dumps({"text": s}) + "\n" for s in (
        "I will run it.\n</think>\n\n" + call + "<|im_end|>", "It worked.\n</think>\n\n" + ANSWER + "<|im_end|>")))
    return serve(str(qwen3_5_dir), "--backend", "replay", "--replay", str(steps), "--served-model-name", MODEL,
                 api_key=API_KEY)


def folders(tmp_path):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    connects = None
    if shutil.which("strace"):
        connects = tmp_path / "connects.txt"
    else:
        assert not os.environ.get("CI"), "strace is missing: tests/run.sh installs it"
    return home, work, connects


def outcome(process) -> str:
    return f"exit {process.returncode}\nstdout:\n{process.stdout[-4000:]}\nstderr:\n{process.stderr[-4000:]}"


def the_tool_result(proxy) -> tuple[dict, dict]:
    """The call the client ran and the result it sent back, from its second request."""
    first, second = proxy.bodies("/v1/chat/completions")
    assert first["stream"] is True and first["tools"]
    assistant, result = second["messages"][-2:]
    (call,) = assistant["tool_calls"]
    assert result["role"] == "tool" and result["tool_call_id"] == call["id"]
    return call, result


def test_opencode_runs_a_shell_command_and_answers(installed, serve, qwen3_5_dir, tmp_path):
    server = replayed(serve, qwen3_5_dir, tmp_path, qwen_call("bash", command="echo looptrace-ok"))
    home, work, connects = folders(tmp_path)
    with clients.RecordingProxy(server.url) as proxy:
        clients.opencode_home(home, installed, proxy.base_url, MODEL)
        done = clients.run_opencode(installed, home, work, API_KEY, "Run echo looptrace-ok", connections=connects)
    assert done.returncode == 0, outcome(done)
    # Its later turns were encoded from its first and checked against whole encodings (conftest.py).
    assert server.metric("looptrace_render_checks_total", result="same") >= 1
    events = clients.json_lines(done.stdout)
    (tool,) = [e["part"] for e in events if e.get("type") == "tool_use"]
    assert (tool["tool"], tool["state"]["status"], tool["state"]["input"]) == (
        "bash", "completed", {"command": "echo looptrace-ok"})
    assert [e["part"]["text"] for e in events if e.get("type") == "text"][-1] == ANSWER
    if connects is not None:
        assert clients.connected_to(connects) == {f"127.0.0.1:{proxy.port}"}
    call, result = the_tool_result(proxy)
    assert call["function"]["name"] == "bash" and json.loads(call["function"]["arguments"]) == {
        "command": "echo looptrace-ok"}
    assert "looptrace-ok" in json.dumps(result["content"])
    # opencode names its session in headers, which group its requests.
    session = proxy.requests[0]["headers"]["x-session-affinity"]
    server.wait_until(lambda: len(server.get(f"/v1/sessions/{session}")[1].get("steps", [])) == 2, 15)


def test_qwen_code_runs_a_shell_command_and_answers(installed, serve, qwen3_5_dir, tmp_path):
    server = replayed(serve, qwen3_5_dir, tmp_path, qwen_call("run_shell_command", command="echo looptrace-ok",
                                                              description="Print a word"))
    home, work, connects = folders(tmp_path)
    clients.qwen_home(home)
    with clients.RecordingProxy(server.url) as proxy:
        done = clients.run_qwen(installed, home, work, proxy.base_url, API_KEY, MODEL, "Run echo looptrace-ok",
                                "--allowed-tools", "run_shell_command", connections=connects)
    assert done.returncode == 0, outcome(done)
    # Its later turns were encoded from its first and checked against whole encodings (conftest.py).
    assert server.metric("looptrace_render_checks_total", result="same") >= 1
    events = json.loads(done.stdout)
    final = events[-1]
    assert (final["type"], final["subtype"], final["result"]) == ("result", "success", ANSWER), outcome(done)
    if connects is not None:
        assert clients.connected_to(connects) == {f"127.0.0.1:{proxy.port}"}
    call, result = the_tool_result(proxy)
    assert call["function"]["name"] == "run_shell_command"
    assert json.loads(call["function"]["arguments"])["command"] == "echo looptrace-ok"
    assert "looptrace-ok" in json.dumps(result["content"])
