"""The real codex (clients.CODEX) over the Responses WebSocket mode (GET /v1/responses): with its
built-in `openai` provider pointed at looptrace (`openai_base_url`), which tries the socket first and
used to get a 405 six times before falling back to HTTP, and with docs/clients.md's custom provider
opted in (`supports_websockets = true`). Either way a tool-calling turn runs over the socket.

The replay backend scripts the tiny Qwen3.5's answers (a shell call, then the answer), as in
test_clients.py; codex runs in a bare environment with its own home, logged in with an API key.
"""

from __future__ import annotations

import json
import re
import subprocess

import clients

from looptrace.common import attributes as attr

from .test_clients import API_KEY, CODEX_ANSWER, MODEL, call, folders, outcome, replay_server


def builtin_openai_home(home, base_url: str, codex: str) -> None:
    """codex's own `openai` provider, its base URL changed: what most people point at a server first."""
    config = home / ".codex"
    config.mkdir(parents=True, exist_ok=True)
    (config / "config.toml").write_text(f'model = "{MODEL}"\nopenai_base_url = "{base_url}"\n')
    env = clients.client_env(home, API_KEY, CODEX_HOME=str(config))
    login = subprocess.run([codex, "login", "--with-api-key"], input=API_KEY, env=env, capture_output=True,
                           text=True, timeout=60)
    assert login.returncode == 0, outcome(login)


def test_codex_builtin_provider_runs_a_tool_call_over_the_websocket(installed, serve, qwen3_5_dir, tmp_path):
    server = replay_server(serve, qwen3_5_dir, tmp_path,
                           "I will run it.\n</think>\n\n" + call("exec_command", cmd="echo looptrace-ok") + "<|im_end|>",
                           "It worked.\n</think>\n\n" + CODEX_ANSWER + "<|im_end|>")
    home, work = folders(tmp_path)
    builtin_openai_home(home, server.base_url, str(installed.codex))
    done = clients.run_codex(installed, home, work, API_KEY, "Run echo looptrace-ok", timeout=120)
    assert done.returncode == 0, outcome(done)
    assert done.stdout.strip().endswith(CODEX_ANSWER), outcome(done)
    # A 405 as a status, not the digits of a port (":40583") or a timestamp's milliseconds (",405").
    refused = re.compile(r"(?<![\w:,.])405(?!\w)")
    assert not refused.search(server.log() + done.stderr), outcome(done)
    assert "falling back to HTTP" not in done.stderr, outcome(done)
    # Both turns came over the socket: each traced as a WebSocket turn, none as an HTTP POST.
    status, listed = server.get("/v1/traces?limit=20")
    assert status == 200, listed
    endpoints = [t["endpoint"] for t in listed["data"]]
    assert endpoints == [attr.ENDPOINT_RESPONSES_WEBSOCKET] * 2, endpoints
    # The tool ran on codex's side and its output reached the model in the second turn.
    second = listed["data"][0]["trace_id"]
    status, prompt = server.get(f"/v1/traces/{second}/prompt")
    text = "".join(token[1] for token in prompt["tokens"])
    assert "looptrace-ok" in text.split("echo looptrace-ok", 1)[-1], text[-2000:]
    assert json.dumps(listed)  # the listing is JSON all through


def test_codex_custom_provider_with_websockets_runs_a_tool_call_over_the_socket(installed, serve, qwen3_5_dir,
                                                                               tmp_path):
    server = replay_server(serve, qwen3_5_dir, tmp_path,
                           "I will run it.\n</think>\n\n" + call("exec_command", cmd="echo looptrace-ok") + "<|im_end|>",
                           "It worked.\n</think>\n\n" + CODEX_ANSWER + "<|im_end|>")
    home, work = folders(tmp_path)
    # docs/clients.md's [model_providers.looptrace], with the socket asked for.
    clients.codex_home(home, server.base_url, MODEL, provider={"supports_websockets": True})
    done = clients.run_codex(installed, home, work, API_KEY, "Run echo looptrace-ok", timeout=120)
    assert done.returncode == 0, outcome(done)
    assert done.stdout.strip().endswith(CODEX_ANSWER), outcome(done)
    assert "falling back to HTTP" not in done.stderr, outcome(done)
    status, listed = server.get("/v1/traces?limit=20")
    assert status == 200, listed
    endpoints = [t["endpoint"] for t in listed["data"]]
    assert endpoints == [attr.ENDPOINT_RESPONSES_WEBSOCKET] * 2, endpoints
    second = listed["data"][0]["trace_id"]
    status, prompt = server.get(f"/v1/traces/{second}/prompt")
    text = "".join(token[1] for token in prompt["tokens"])
    assert "looptrace-ok" in text.split("echo looptrace-ok", 1)[-1], text[-2000:]
