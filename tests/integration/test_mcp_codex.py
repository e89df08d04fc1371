"""The real codex with `looptrace mcp` as one of its MCP servers (docs/mcp.md's config.toml), end to end:
the replayed model calls get_session on a session recorded earlier, codex starts `looptrace mcp` over
stdio and calls it, and the tool's result reaches the model's next prompt (seen by a recording proxy
between codex and looptrace)."""

from __future__ import annotations

import json
import uuid

import clients
from server import looptrace_command

API_KEY = "sk-looptrace-test"
MODEL = "qwen3.5-tiny"
MARKER = "narwhal-" + uuid.uuid4().hex[:10]
ANSWER = "The earlier run was asked about a narwhal."


def call(name, **params):
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def test_codex_calls_get_session_and_the_result_reaches_the_next_prompt(installed, serve, qwen3_5_dir, tmp_path):
    steps = tmp_path / "steps.jsonl"
    steps.write_text("".join(json.dumps({"text": s}) + "\n" for s in (
        f"\n</think>\n\nNoted {MARKER}.<|im_end|>",  # the earlier run's one step
        "I will look.\n</think>\n\n" + call("mcp__looptrace.get_session", key="earlier-run") + "<|im_end|>",
        "Found it.\n</think>\n\n" + ANSWER + "<|im_end|>")))
    server = serve(str(qwen3_5_dir), "--backend", "replay", "--replay", str(steps), "--served-model-name", MODEL,
                   api_key=API_KEY)
    status, _ = server.post("/v1/chat/completions", {"model": MODEL, "messages": [
        {"role": "user", "content": f"remember {MARKER}"}]}, headers={"session_id": "earlier-run"})
    assert status == 200
    server.wait_until(lambda: server.get("/v1/sessions/earlier-run")[0] == 200, 30)  # stored: the tool can read it
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    with clients.RecordingProxy(server.url) as proxy:
        codex = clients.codex_home(home, proxy.base_url, MODEL)
        command = looptrace_command()
        with open(codex / "config.toml", "a") as config:
            # required: codex waits for the server before its first turn (else the tools may not be offered yet).
            config.write("\n[mcp_servers.looptrace]\n"
                         f"command = {json.dumps(command[0])}\n"
                         f"args = {json.dumps([*command[1:], 'mcp', '--store', str(server.trace_db)])}\n"
                         "required = true\n")
        done = clients.run_codex(installed, home, work, API_KEY, "What was the earlier run about?", timeout=120)
    bodies = proxy.bodies("/v1/responses")
    assert done.returncode == 0, clients_outcome(done)
    assert done.stdout.strip().endswith(ANSWER), clients_outcome(done)
    first, second = bodies
    # codex offers an MCP server's tools as one namespace, the model naming each `mcp__looptrace.TOOL`.
    (offered,) = [t for t in first["tools"] if t.get("name") == "mcp__looptrace"]
    assert {"list_sessions", "get_session", "get_step", "search", "diff_steps"} <= {t["name"] for t in offered["tools"]}
    (made,) = [item for item in second["input"] if item.get("type") == "function_call"]
    assert (made["name"], made.get("namespace")) == ("get_session", "mcp__looptrace"), made
    (result,) = [item for item in second["input"] if item.get("type") == "function_call_output"]
    assert result["call_id"] == made["call_id"]
    output = result["output"] if isinstance(result["output"], str) else json.dumps(result["output"])
    assert "# session earlier-run" in output and MARKER in output, output


def clients_outcome(process) -> str:
    return f"exit {process.returncode}\nstdout:\n{process.stdout[-4000:]}\nstderr:\n{process.stderr[-4000:]}"
