"""GitHub Copilot CLI (`@github/copilot`, pinned in tests/support/harnesses.py) against a real
`looptrace serve`, on both of its OpenAI wires, through a tool call and back.

Copilot's own-key mode (COPILOT_PROVIDER_*, COPILOT_OFFLINE=true) as docs/clients.md sets it up: the
replay backend writes a call of its shell tool `bash`, Copilot runs it and sends the result back (a
recording proxy keeps what it sent), then prints the answer.
"""

from __future__ import annotations

import json

import pytest

import clients
import harnesses
from harnesses import MODEL, folders, grouping, last_prompt, outcome, replayed
from messages_api import qwen_call

API_KEY = "sk-looptrace-test"
ANSWER = "The command printed looptrace-ok."
PATHS = {"completions": "/v1/chat/completions", "responses": "/v1/responses"}


def shell_result(wire: str, second: dict) -> tuple[dict, str]:
    """The bash call Copilot sends back in its second request, and the result beside it."""
    if wire == "completions":
        assistant, result = second["messages"][-2:]
        (call,) = assistant["tool_calls"]
        assert result["role"] == "tool" and result["tool_call_id"] == call["id"]
        assert assistant["reasoning_content"] == "I will run it."  # it read the field it sends back
        return json.loads(call["function"]["arguments"]), result["content"]
    (call,) = [i for i in second["input"] if i.get("type") == "function_call"]
    (result,) = [i for i in second["input"] if i.get("type") == "function_call_output"]
    assert call["name"] == "bash" and result["call_id"] == call["call_id"]
    return json.loads(call["arguments"]), result["output"]


@pytest.mark.parametrize("wire", ["completions", "responses"])
def test_copilot_runs_its_shell_tool_and_answers(installed_harnesses, serve, qwen3_5_dir, tmp_path, wire):
    server = replayed(serve, qwen3_5_dir, tmp_path, API_KEY,
                      "I will run it.\n</think>\n\n" + qwen_call("bash", command="echo looptrace-ok",
                                                                   description="Print a word") + "<|im_end|>",
                      "It worked.\n</think>\n\n" + ANSWER + "<|im_end|>")
    home, work = folders(tmp_path)
    with clients.RecordingProxy(server.url) as proxy:
        done = harnesses.run_copilot(installed_harnesses, home, work, proxy.base_url, API_KEY, MODEL,
                                     "Run echo looptrace-ok", wire_api=wire)
    assert done.returncode == 0, outcome(done)
    assert ANSWER in done.stdout, outcome(done)
    assert {r["path"] for r in proxy.requests} == {PATHS[wire]}  # nothing else: no models list, no GitHub
    first, second = proxy.bodies(PATHS[wire])
    assert first["stream"] is True and "bash" in [t.get("name") or t["function"]["name"] for t in first["tools"]]
    arguments, result = shell_result(wire, second)
    assert arguments == {"command": "echo looptrace-ok", "description": "Print a word"}
    assert result.startswith("looptrace-ok\n")
    assert result in last_prompt(server)  # the model read the tool's output
    # Copilot names itself by GitHub's x-initiator header only (its User-Agent is openai-node's). It
    # sends no session id: on Responses its prompt_cache_key groups the run, on Chat Completions its
    # history does (the second request extends the first's prompt and answer).
    assert grouping(server, 2) == [("copilot", 2)]


PATCH = "*** Begin Patch\n*** Add File: made-by-looptrace.txt\n+written through apply_patch\n*** End Patch"


def test_copilot_applies_a_patch_through_its_custom_tool_on_chat_completions(installed_harnesses, serve, qwen3_5_dir,
                                                                             tmp_path):
    # For a GPT-5 codex model name Copilot offers apply_patch as OpenAI's custom (free-form) tool.
    model = "gpt-5.1-codex"
    server = replayed(serve, qwen3_5_dir, tmp_path, API_KEY,
                      "A new file.\n</think>\n\n" + qwen_call("apply_patch", input=PATCH) + "<|im_end|>",
                      "Done.\n</think>\n\nI created made-by-looptrace.txt.<|im_end|>", model=model)
    home, work = folders(tmp_path)
    with clients.RecordingProxy(server.url) as proxy:
        done = harnesses.run_copilot(installed_harnesses, home, work, proxy.base_url, API_KEY, model,
                                     "Create the file")
    assert done.returncode == 0, outcome(done)
    assert (work / "made-by-looptrace.txt").read_text() == "written through apply_patch\n"
    first, second = proxy.bodies("/v1/chat/completions")
    (offered,) = [t for t in first["tools"] if t["type"] == "custom"]
    assert offered["custom"]["name"] == "apply_patch" and offered["custom"]["format"]["grammar"]["syntax"] == "lark"
    # The model was shown the grammar, as the description of the one string it writes.
    assert offered["custom"]["format"]["grammar"]["definition"].splitlines()[0] in last_prompt(server)
    assistant, result = second["messages"][-2:]
    (call,) = assistant["tool_calls"]
    assert (call["type"], call["custom"]) == ("custom", {"name": "apply_patch", "input": PATCH})
    assert result["role"] == "tool" and result["tool_call_id"] == call["id"]
    assert result["content"] in last_prompt(server)
