"""The OpenAI Agents SDK (`openai-agents`, on Responses and on Chat Completions) and the Claude Agent
SDK (`claude-agent-sdk`, which drives the Claude Code CLI bundled in its wheel) against a real
`looptrace serve`, each through a tool call and back. Both are pinned in tests/support/harnesses.py
and run from an environment of their own, in a bare environment with their uploads switched off.
"""

from __future__ import annotations

import json

import pytest

import clients
import harnesses
from harnesses import MODEL, folders, grouping, last_prompt, outcome, replayed
from messages_api import qwen_call

API_KEY = "sk-looptrace-test"
ANSWER = "The word is looptrace-ok."

# The Agents SDK's own example shape: a function tool, an agent, Runner.run_sync; the answer as JSON.
AGENTS_SCRIPT = """
import json, os
from agents import Agent, Runner, function_tool, set_default_openai_api

@function_tool
def secret_word(topic: str) -> str:
    \"\"\"The secret word for a topic.\"\"\"
    return "looptrace-ok for " + topic

if os.environ["WIRE"] == "chat_completions":
    set_default_openai_api("chat_completions")
agent = Agent(name="Helper", instructions="Answer with the tool's word.", model=os.environ["MODEL"],
              tools=[secret_word])
result = Runner.run_sync(agent, "What is the secret word for tests?")
print(json.dumps({"final_output": result.final_output,
                  "items": [item.type for item in result.new_items]}))
"""

PATHS = {"responses": "/v1/responses", "chat_completions": "/v1/chat/completions"}


@pytest.mark.parametrize("wire", ["responses", "chat_completions"])
def test_openai_agents_sdk_runs_a_function_tool(installed_harnesses, serve, qwen3_5_dir, tmp_path, wire):
    server = replayed(serve, qwen3_5_dir, tmp_path, API_KEY,
                      "I will ask.\n</think>\n\n" + qwen_call("secret_word", topic="tests") + "<|im_end|>",
                      "Got it.\n</think>\n\n" + ANSWER + "<|im_end|>")
    home, work = folders(tmp_path)
    with clients.RecordingProxy(server.url) as proxy:
        done = harnesses.run_sdk(installed_harnesses, home, work, AGENTS_SCRIPT, API_KEY, WIRE=wire, MODEL=MODEL,
                                 OPENAI_BASE_URL=proxy.base_url, OPENAI_API_KEY=API_KEY,
                                 OPENAI_AGENTS_DISABLE_TRACING="1")
    assert done.returncode == 0, outcome(done)
    ran = json.loads(done.stdout.strip().splitlines()[-1])
    assert ran == {"final_output": ANSWER, "items": ["reasoning_item", "tool_call_item", "tool_call_output_item",
                                                     "reasoning_item", "message_output_item"]}
    assert {r["path"] for r in proxy.requests} == {PATHS[wire]}  # its tracing upload is off
    first, second = proxy.bodies(PATHS[wire])
    assert "stream" not in first  # Runner.run_sync asks for whole answers
    if wire == "responses":
        (call,) = [i for i in second["input"] if i.get("type") == "function_call"]
        (output,) = [i for i in second["input"] if i.get("type") == "function_call_output"]
        assert output["call_id"] == call["call_id"] and call["id"].startswith("fc_")  # our ids, echoed
        result = output["output"]
    else:
        assistant, tool = second["messages"][-2:]
        (call,) = assistant["tool_calls"]
        assert tool == {"role": "tool", "tool_call_id": call["id"], "content": "looptrace-ok for tests"}
        result = tool["content"]
    assert result == "looptrace-ok for tests" and result in last_prompt(server)
    # It sends no session id and no prompt_cache_key: its history groups the run into one session, its
    # client named from `Agents/Python 0.24.0`.
    assert grouping(server, 2) == [("Agents", 2)]


CLAUDE_SCRIPT = """
import anyio, json, os
from claude_agent_sdk import AssistantMessage, ClaudeAgentOptions, ResultMessage, ToolUseBlock, query

async def main():
    options = ClaudeAgentOptions(allowed_tools=["Bash"], max_turns=3, model=os.environ["MODEL"])
    tools, result = [], None
    async for message in query(prompt="Run echo looptrace-ok", options=options):
        if isinstance(message, AssistantMessage):
            tools += [block.name for block in message.content if isinstance(block, ToolUseBlock)]
        elif isinstance(message, ResultMessage):
            result = {"subtype": message.subtype, "is_error": message.is_error, "result": message.result}
    print(json.dumps({"tools": tools, "result": result}))

anyio.run(main)
"""


def test_claude_agent_sdk_runs_bash(installed_harnesses, serve, qwen3_5_dir, tmp_path):
    server = replayed(serve, qwen3_5_dir, tmp_path, API_KEY,
                      "I will run it.\n</think>\n\n" + qwen_call("Bash", command="echo looptrace-ok",
                                                                   description="Print a word") + "<|im_end|>",
                      "It worked.\n</think>\n\n" + ANSWER + "<|im_end|>")
    home, work = folders(tmp_path)
    with clients.RecordingProxy(server.url) as proxy:
        env = clients.claude_env(home, f"http://127.0.0.1:{proxy.port}", API_KEY, MODEL, DISABLE_TELEMETRY="1")
        env = {k: v for k, v in env.items() if k not in ("PATH", "HOME", "LANG", clients.API_KEY_ENV)}
        done = harnesses.run_sdk(installed_harnesses, home, work, CLAUDE_SCRIPT, API_KEY, MODEL=MODEL, **env)
    assert done.returncode == 0, outcome(done)
    ran = json.loads(done.stdout.strip().splitlines()[-1])
    assert ran == {"tools": ["Bash"], "result": {"subtype": "success", "is_error": False, "result": ANSWER}}
    assert {r["path"] for r in proxy.requests} == {"/v1/messages"}
    first, second = proxy.bodies("/v1/messages")
    assert "Bash" in [t["name"] for t in first["tools"]]
    (result,) = [b for b in second["messages"][-1]["content"] if b.get("type") == "tool_result"]
    (call,) = [b for b in second["messages"][-2]["content"] if b.get("type") == "tool_use"]
    assert result["tool_use_id"] == call["id"] and result["content"] == "looptrace-ok" and not result["is_error"]
    assert "<tool_response>\nlooptrace-ok\n</tool_response>" in last_prompt(server)
    # Its bundled Claude Code names the session (X-Claude-Code-Session-Id) and itself.
    agent = proxy.requests[0]["headers"]["User-Agent"]
    assert agent.startswith("claude-cli/") and "agent-sdk/" + harnesses.CLAUDE_AGENT_SDK.split("==")[1] in agent
    assert grouping(server, 2) == [("claude-cli", 2)]
