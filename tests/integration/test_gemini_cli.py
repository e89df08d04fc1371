"""Gemini CLI (pinned in tests/support/gemini_cli.py) against a real `looptrace serve` through the
Gemini API: a command run through its shell tool, the call's id and the command's output sent back,
the output in the prompt of the next step, and the two steps one session."""

from __future__ import annotations

import json
import os

import pytest

import clients
import gemini_cli
from messages_api import qwen_call

MODEL = "qwen3.5-tiny"
API_KEY = "sk-looptrace-test"
MARKER = "gemini-was-here"
ANSWER = "The command printed the marker."
STREAM = f"/v1beta/models/{MODEL}:streamGenerateContent"


@pytest.fixture(scope="module")
def gemini():
    try:
        return gemini_cli.install()
    except clients.MissingNpm as exc:
        if os.environ.get("CI"):
            raise  # CI installs npm: a missing one is a failure there, not a skip
        pytest.skip(str(exc))


def test_gemini_cli_runs_a_command_and_reads_its_output(gemini, serve, qwen3_5_dir, tmp_path):
    steps = tmp_path / "steps.jsonl"
    steps.write_text("".join(json.dumps({"text": s}) + "\n" for s in (
        "I will run it.\n</think>\n\n" + qwen_call("run_shell_command", command=f"echo {MARKER}",
                                                   description="print a marker") + "<|im_end|>",
        "It printed it.\n</think>\n\n" + ANSWER + "<|im_end|>")))
    server = serve(str(qwen3_5_dir), "--backend", "replay", "--replay", str(steps), "--served-model-name", MODEL,
                   api_key=API_KEY)
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    with clients.RecordingProxy(server.url) as proxy:
        done = gemini_cli.run(gemini, home, work, f"http://127.0.0.1:{proxy.port}", API_KEY, MODEL,
                              f"Run the command: echo {MARKER}")
    said = f"exit {done.returncode}\nstdout:\n{done.stdout[-4000:]}\nstderr:\n{done.stderr[-4000:]}"
    assert done.returncode == 0 and ANSWER in done.stdout, said
    assert [(r["method"], r["path"]) for r in proxy.requests] == [("POST", STREAM)] * 2, proxy.requests
    assert all(r["headers"].get("x-goog-api-key") == API_KEY for r in proxy.requests)
    first, second = proxy.bodies(STREAM)
    assert first["generationConfig"]["thinkingConfig"] == {"includeThoughts": True}
    assert {"run_shell_command", "read_file"} <= {d["name"] for t in first["tools"] for d in t["functionDeclarations"]}
    # The call goes back with the id looptrace gave it, and the command's output answers it.
    (call,) = [p["functionCall"] for p in second["contents"][-2]["parts"] if "functionCall" in p]
    (response,) = [p["functionResponse"] for p in second["contents"][-1]["parts"]]
    assert call["id"].startswith("call_") and response["id"] == call["id"]
    assert call["args"]["command"] == f"echo {MARKER}" and MARKER in response["response"]["output"]
    def both_stored() -> list[dict] | None:
        status, listing = server.get("/v1/traces?limit=3")
        return listing["data"] if status == 200 and len(listing["data"]) == 2 else None

    newest = server.wait_until(both_stored, 15)[0]  # newest first: the step after the call
    status, trace = server.get(f"/v1/traces/{newest['trace_id']}")
    assert status == 200, trace
    render = next(s for s in trace["spans"] if s["name"] == "render")["attributes"]
    assert f"Output: {MARKER}" in render["looptrace.prompt.text"]
    root = next(s for s in trace["spans"] if s["attributes"].get("looptrace.endpoint"))["attributes"]
    assert root["looptrace.endpoint"] == "gemini"
    assert root["gen_ai.request.model"] == root["looptrace.request.model_asked"] == MODEL  # as -m named it
    # It sends no session id: its two steps are one session by their history.
    (session,) = server.get("/v1/sessions")[1]["data"]
    assert (session["steps"], session["tool_calls"]["valid"], session["client"]) == (2, 1, "GeminiCLI-tui"), session
