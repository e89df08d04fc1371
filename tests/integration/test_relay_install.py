"""A relay installs without torch (issue 45): `pip install looptrace` in a clean environment
(relay_install.py) holds no torch, and from it `looptrace serve --backend vllm` relays a conversation to
the vLLM test double, `--backend replay` serves recorded output, `looptrace export` (JSON Lines and
ATIF) and `looptrace replay` (step mode, against that relay) run; `looptrace serve` with the local
backend says the one line that installs torch and exits 2."""

from __future__ import annotations

import json
import subprocess

import pytest

import relay_install
from server import free_port
from vllm_double import DoubleProcess

pytestmark = pytest.mark.timeout(1800)  # the dependencies' first install: a minute or two from the index
SESSION = "relay-install-1"


@pytest.fixture(scope="module")
def bin_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("relay-install")
    return relay_install.relay_environment(folder / "venv", relay_install.build_wheel(folder / "wheel"))


@pytest.fixture(scope="module")
def double(qwen3_5_dir, tmp_path_factory):
    logs = tmp_path_factory.mktemp("relay-install-double")
    started = DoubleProcess(qwen3_5_dir, port=free_port(), log_path=logs / "double.log", fast=True,
                            served_model_name="tiny")
    try:
        started.wait_ready()
        yield started
    finally:
        started.stop()


def run(bin_dir, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(bin_dir / "looptrace"), *args], capture_output=True, text=True, timeout=600)


def test_the_install_holds_no_torch(bin_dir):
    done = subprocess.run([str(bin_dir / "python"), "-c", "import torch"], capture_output=True, text=True)
    assert done.returncode == 1 and "No module named 'torch'" in done.stderr
    # Every module a relay, the viewer and the exporters import, imported in the install itself.
    check = ("import looptrace.proxy.api.app, looptrace.proxy.export.command, looptrace.proxy.replay.run, "
             "looptrace.backends.vllm.backend, looptrace.backends.recorded, looptrace.families.qwen3_5, "
             "looptrace.trace_store.sqlite.store; import importlib.metadata as m; "
             "print(sorted(r.split(';')[0] for r in m.requires('looptrace') if 'extra ==' not in r))")
    done = subprocess.run([str(bin_dir / "python"), "-c", check], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert not any(r.startswith(("torch", "accelerate")) for r in json.loads(done.stdout.replace("'", '"')))
    checked = subprocess.run([str(bin_dir / "python"), "-m", "pip", "check"], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout  # every dependency of the wheel is there


def test_the_local_backend_says_how_to_install_torch(bin_dir, qwen3_5_dir):
    done = run(bin_dir, "serve", str(qwen3_5_dir), "--port", str(free_port()))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == ("looptrace serve: --backend local decodes on this machine with "
                                                    "torch, not installed: pip install 'looptrace[local]'")


def test_a_relay_and_a_replay_server_serve_and_export_and_replay_run(bin_dir, double, serve, qwen3_5_dir,
                                                                     tmp_path):
    program = [str(bin_dir / "looptrace")]
    relay = serve(str(qwen3_5_dir), "--backend", "vllm", "--vllm-url", double.url, "--served-model-name", "tiny",
                  program=program)
    messages = [{"role": "user", "content": "Say something."}]
    for _ in range(2):
        status, answer = relay.post("/v1/chat/completions", {"model": "tiny", "messages": messages, "max_tokens": 8,
                                                             "temperature": 0}, headers={"session_id": SESSION})
        assert status == 200, answer
        messages += [answer["choices"][0]["message"], {"role": "user", "content": "More."}]
    assert "model runtime kept out: torch not imported" in relay.log()

    relay.wait_until(lambda: relay.get(f"/v1/sessions/{SESSION}")[1].get("steps_total") == 2, 30)
    steps = run(bin_dir, "export", "--store", str(relay.trace_db), "--session", SESSION)
    assert steps.returncode == 0, steps.stderr
    assert [json.loads(line)["step"] for line in steps.stdout.splitlines()] == [1, 2]
    trajectory = run(bin_dir, "export", "--store", str(relay.trace_db), "--session", SESSION, "--format", "atif")
    assert trajectory.returncode == 0, trajectory.stderr
    assert [s["source"] for s in json.loads(trajectory.stdout)["steps"]] == ["user", "agent", "user", "agent"]

    report = tmp_path / "report.json"
    replayed = run(bin_dir, "replay", "--store", str(relay.trace_db), "--session", SESSION, "--target", relay.url,
                   "--mode", "step", "--report", str(report))
    assert replayed.returncode == 0, replayed.stderr
    assert [s["step"] for s in json.loads(report.read_text())["steps"]] == [1, 2]

    recorded = tmp_path / "recorded.jsonl"
    recorded.write_text(json.dumps({"text": "Thought.\n</think>\n\nRecorded answer.<|im_end|>"}) + "\n")
    replay = serve(str(qwen3_5_dir), "--backend", "replay", "--replay", str(recorded), "--served-model-name", "tiny",
                   program=program)
    status, answer = replay.post("/v1/chat/completions", {"model": "tiny", "messages": messages[:1]})
    assert status == 200 and "Recorded answer." in answer["choices"][0]["message"]["content"], answer
    assert "model runtime kept out: torch not imported" in replay.log()
