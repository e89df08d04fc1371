"""`--backend vllm` without `--vllm-url`: looptrace starts the server itself (--vllm-command), waits
for it, says why it failed, starts it again when it dies, and stops it with itself.

The server started here is the vLLM double (tests/support/vllm_double.py), which takes vLLM's
`--model` and `--port`; tests/integration/test_real_vllm.py starts the real one the same way."""

from __future__ import annotations

import os
import shlex
import signal
import sys
from pathlib import Path

import pytest

from waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
DOUBLE = f"{shlex.quote(sys.executable)} -m tests.support.vllm_double --model {{model}} --port {{port}}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _failed(server, timeout: float = 60) -> dict:
    health: dict = {}

    def done() -> bool:
        nonlocal health
        health = server.get("/health")[1]
        return health.get("status") == "failed"

    server.wait_until(done, timeout)
    return health


@pytest.fixture(scope="module")
def spawning(serve, qwen3_5_dir):
    return serve(str(qwen3_5_dir), "--backend", "vllm", "--vllm-command", DOUBLE, "--served-model-name", "tiny-qwen",
                 env={"PYTHONPATH": str(ROOT)})


def test_it_starts_vllm_and_serves_through_it(spawning):
    health = spawning.get("/health")[1]
    spawned = health["spawned"]
    assert spawned["running"] and "tests.support.vllm_double" in spawned["command"]
    assert health["upstreams"][0]["url"].startswith("http://127.0.0.1:")
    status, answer = spawning.post("/v1/chat/completions", {
        "model": "tiny-qwen", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
    assert status == 200 and answer["usage"]["completion_tokens"] >= 1, answer
    assert "vllm| " in spawning.log()  # its output, prefixed, in looptrace's log


def test_a_server_that_dies_is_started_again(spawning):
    before = spawning.get("/health")[1]["spawned"]
    os.kill(before["pid"], signal.SIGKILL)

    def restarted() -> bool:
        spawned = spawning.get("/health")[1].get("spawned", {})
        return spawned.get("restarts", 0) > before["restarts"] and spawned.get("running")

    spawning.wait_until(restarted, 120)

    def answers() -> bool:  # the pool's probe takes it back within its interval
        return spawning.post("/v1/chat/completions", {
            "model": "tiny-qwen", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})[0] == 200

    spawning.wait_until(answers, 60)
    assert "vLLM exited with code" in spawning.log()


def test_stopping_looptrace_stops_the_server(serve, qwen3_5_dir):
    server = serve(str(qwen3_5_dir), "--backend", "vllm", "--vllm-command", DOUBLE, env={"PYTHONPATH": str(ROOT)})
    pid = server.get("/health")[1]["spawned"]["pid"]
    assert _alive(pid)
    server.stop()
    wait_until(lambda: not _alive(pid), 30, every=0.2, what="the spawned server gone")


def test_a_server_that_exits_at_once_is_reported_with_its_last_lines(serve, qwen3_5_dir):
    command = f"{shlex.quote(sys.executable)} -c \"print('no GPU here: {{model}}'); raise SystemExit(3)\""
    server = serve(str(qwen3_5_dir), "--backend", "vllm", "--vllm-command", command, wait=False)
    reason = _failed(server)["reason"]
    assert "exited with code 3" in reason and f"no GPU here: {qwen3_5_dir}" in reason


def test_a_server_that_never_gets_ready_is_given_up_on(serve, qwen3_5_dir):
    command = f"{shlex.quote(sys.executable)} -c \"import time; print('compiling…', flush=True); time.sleep(600)\""
    server = serve(str(qwen3_5_dir), "--backend", "vllm", "--vllm-command", command, "--vllm-start-timeout", "3",
                   wait=False)
    reason = _failed(server)["reason"]
    assert "not ready after 3 s" in reason and "compiling…" in reason


def test_a_command_that_does_not_exist_says_so(serve, qwen3_5_dir):
    server = serve(str(qwen3_5_dir), "--backend", "vllm", "--vllm-command", "no-such-vllm serve {model}", wait=False)
    assert "could not be run" in _failed(server)["reason"]


def test_a_vllm_it_starts_with_kv_events_is_followed(serve, qwen3_5_dir):
    """`{kv_events}` in the command (the default has it): vLLM's --kv-events-config, publishing on sockets in a
    folder of looptrace's, which looptrace reads, so routing knows what the server holds."""
    command = DOUBLE + " --fast --kv-events-config {kv_events}"
    server = serve(str(qwen3_5_dir), "--backend", "vllm", "--vllm-command", command, "--served-model-name",
                   "tiny-qwen", env={"PYTHONPATH": str(ROOT)})
    health = server.get("/health")[1]
    assert '"endpoint":"ipc://' in health["spawned"]["command"]
    events = health["upstreams"][0]["kv_events"]
    assert events["endpoint"].startswith("ipc://") and events["replay_endpoint"].startswith("ipc://")
    messages = [{"role": "system", "content": "You are terse. " * 30}, {"role": "user", "content": "Hi"}]
    for _ in range(2):
        status, answer = server.post("/v1/chat/completions", {"model": "tiny-qwen", "messages": messages,
                                                             "max_tokens": 4}, headers={"session_id": "s"})
        assert status == 200, answer
    health = server.get("/health")[1]["upstreams"][0]
    assert health["routing_index"] == "events" and health["kv_events"]["blocks"] > 0
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
