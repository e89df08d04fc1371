"""Cline CLI (`cline`, pinned in tests/support/harnesses.py) against a real `looptrace serve`
through Chat Completions, with thinking on, through a tool call and back.

Cline with looptrace as its OpenAI-compatible provider (`cline auth -p openai -b URL`), telemetry and
updates off, as docs/clients.md sets it up: the replay backend writes a call of `run_commands`, Cline
runs it and sends the result back (a recording proxy keeps what it sent); a run ends only when the
model calls `submit_and_exit`, which the second answer does.
"""

from __future__ import annotations

import json

import clients
import harnesses
from harnesses import MODEL, folders, grouping, last_prompt, outcome, replayed
from messages_api import qwen_call

API_KEY = "sk-looptrace-test"
ANSWER = "The command printed looptrace-ok."


def test_cline_runs_a_command_and_submits(installed_harnesses, serve, qwen3_5_dir, tmp_path):
    server = replayed(serve, qwen3_5_dir, tmp_path, API_KEY,
                      "I will run it.\n</think>\n\n" + qwen_call("run_commands", commands='["echo looptrace-ok"]')
                      + "<|im_end|>",
                      "It worked.\n</think>\n\n" + qwen_call("submit_and_exit", summary=ANSWER, verified="true")
                      + "<|im_end|>")
    home, work = folders(tmp_path)
    with clients.RecordingProxy(server.url) as proxy:
        done = harnesses.run_cline(installed_harnesses, home, work, proxy.base_url, API_KEY, MODEL,
                                   "Run echo looptrace-ok", "--thinking", "medium", "--json")
    assert done.returncode == 0, outcome(done)
    events = clients.json_lines(done.stdout)
    (result,) = [e for e in events if e.get("type") == "run_result"]
    assert (result["finishReason"], result["iterations"]) == ("completed", 2), outcome(done)
    ended = [e["event"] for e in events if e.get("type") == "agent_event" and e["event"]["type"] == "content_end"]
    assert [e["reasoning"] for e in ended if e["contentType"] == "reasoning"] == ["I will run it.", "It worked."]
    (ran,) = [e for e in ended if e["contentType"] == "tool" and e["toolName"] == "run_commands"]
    assert ran["output"] == [{"query": "echo looptrace-ok", "result": "looptrace-ok\n", "success": True}]

    first, second = proxy.bodies("/v1/chat/completions")
    assert len(proxy.requests) == 2
    # `--thinking` on the openai provider is reasoning_effort (OpenRouter's `reasoning` object is what
    # its OpenRouter-style providers send: tests/unit/test_chat_reasoning.py).
    assert first["stream"] is True and first["reasoning_effort"] == "medium"
    assert [t["function"]["name"] for t in first["tools"]] == ["read_files", "run_commands", "editor",
                                                               "submit_and_exit"]
    assistant, tool = second["messages"][-2:]
    (call,) = assistant["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"commands": ["echo looptrace-ok"]}
    assert assistant["reasoning_content"] == "I will run it."
    assert tool["tool_call_id"] == call["id"] and "looptrace-ok" in tool["content"]
    assert tool["content"] in last_prompt(server)
    # Nothing it sends names it: ai-sdk's User-Agent alone, none of the headers its bundle holds for its
    # other providers (OpenRouter's X-Title and HTTP-Referer, its own X-CLIENT-TYPE and X-Task-ID).
    for sent in proxy.requests:
        assert sent["headers"]["User-Agent"].startswith("ai-sdk/openai-compatible/")
        assert not {"x-title", "http-referer", "x-client-type", "x-task-id"} & {h.lower() for h in sent["headers"]}
    # Behind ai-sdk's User-Agent Cline is an unknown client; it sends no session id, and its history
    # groups its two requests into one session.
    assert grouping(server, 2) == [(None, 2)]
