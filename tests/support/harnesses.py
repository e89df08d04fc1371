"""The harnesses run beside codex and pi (clients.py): GitHub Copilot CLI and Cline CLI from npm, and
the OpenAI Agents SDK and the Claude Agent SDK from PyPI, each pinned and installed once into the test
cache, each run in a bare environment that reaches nothing but looptrace.

`python tests/support/harnesses.py` installs them (tests/run.sh does, before the tests); the tests
install them on first use too. The SDKs get an environment of their own (as vLLM does): the Agents
SDK pins an `openai` and `mcp` of its own, and neither belongs in the server's test environment.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import build_cache
from clients import API_KEY_ENV, client_env, npm_packages

# The versions issue 56 was tried with; bump here and re-run tests/integration/test_copilot_cli.py,
# test_cline.py and test_agent_sdks.py.
COPILOT = "@github/copilot@1.0.102"
CLINE = "cline@3.0.65"
NPM_HARNESSES = (COPILOT, CLINE)
OPENAI_AGENTS = "openai-agents==0.24.0"
CLAUDE_AGENT_SDK = "claude-agent-sdk==0.2.190"
SDKS = (OPENAI_AGENTS, CLAUDE_AGENT_SDK)


@dataclass(frozen=True)
class Harnesses:
    copilot: Path
    cline: Path
    sdk_python: Path  # the Python of the agent SDKs' environment


def install() -> Harnesses:
    npm_dir = npm_packages("npm-harnesses", NPM_HARNESSES)
    sdk_dir = build_cache.cached("agent-sdks-venv", {"packages": list(SDKS), "python": sys.version[:4]},
                                 _sdk_install)
    bin_dir = npm_dir / "node_modules" / ".bin"
    return Harnesses(copilot=bin_dir / "copilot", cline=bin_dir / "cline",
                     sdk_python=sdk_dir / "venv" / "bin" / "python")


def _run(command: list[str], what: str) -> None:
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1200)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed ({done.returncode}):\n{done.stdout[-4000:]}")


def _sdk_install(out: Path) -> dict:
    venv = out / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], "creating the agent SDKs' environment")
    _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *SDKS], "pip install " + " ".join(SDKS))
    return {}


# -- what every harness test does --

MODEL = "qwen3.5-tiny"


def replayed(serve, checkpoint: Path, tmp_path: Path, api_key: str, *steps: str, model: str = MODEL):
    """`looptrace serve` with the replay backend answering `steps` in turn (Qwen3.5-format text)."""
    path = tmp_path / "steps.jsonl"
    path.write_text("".join(json.dumps({"text": s}) + "\n" for s in steps))
    return serve(str(checkpoint), "--backend", "replay", "--replay", str(path), "--served-model-name", model,
                 api_key=api_key)


def folders(tmp_path: Path) -> tuple[Path, Path]:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    return home, work


def outcome(process: subprocess.CompletedProcess) -> str:
    return f"exit {process.returncode}\nstdout:\n{process.stdout[-4000:]}\nstderr:\n{process.stderr[-4000:]}"


def sessions(server, requests: int) -> list[dict]:
    """The server's sessions, most recently active first, once a run's `requests` are all stored."""
    def stored() -> list[dict] | None:
        status, listing = server.get(f"/v1/traces?limit={requests + 1}")
        if status != 200 or len(listing["data"]) < requests:
            return None
        return server.get("/v1/sessions")[1]["data"]

    return server.wait_until(stored, 15)


def grouping(server, requests: int) -> list[tuple[str | None, int]]:
    """(client, steps) of each session the run's `requests` formed, oldest first."""
    return [(s["client"], s["steps"]) for s in reversed(sessions(server, requests))]


def last_prompt(server) -> str:
    """The exact prompt the model read on the newest request (the trace viewer's prompt view)."""
    status, view = server.get(f"/v1/traces/{server.newest_trace_id()}/prompt")
    assert status == 200 and view["text"], view
    return view["text"]


# -- GitHub Copilot CLI --

def run_copilot(harnesses: Harnesses, home: Path, workdir: Path, base_url: str, api_key: str, model: str,
                prompt: str, *, wire_api: str = "completions", timeout: float = 120) -> subprocess.CompletedProcess:
    """Copilot CLI's own-key mode, as docs/clients.md sets it up: an OpenAI-type provider at `base_url`,
    offline (no GitHub sign-in, no telemetry, no update checks), every tool allowed."""
    env = client_env(home, api_key, COPILOT_PROVIDER_BASE_URL=base_url, COPILOT_PROVIDER_TYPE="openai",
                     COPILOT_PROVIDER_API_KEY=api_key, COPILOT_PROVIDER_WIRE_API=wire_api, COPILOT_MODEL=model,
                     COPILOT_OFFLINE="true")
    command = [str(harnesses.copilot), "-p", prompt, "--allow-all-tools"]
    return subprocess.run(command, env=env, cwd=workdir, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout)


# -- Cline CLI --

def cline_dir(home: Path) -> Path:
    """Cline's folder with telemetry and auto-update off (docs/clients.md)."""
    folder = home / ".cline"
    settings = folder / "data" / "settings"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "global-settings.json").write_text(json.dumps({"telemetryOptOut": True, "autoUpdateEnabled": False}))
    return folder


def run_cline(harnesses: Harnesses, home: Path, workdir: Path, base_url: str, api_key: str, model: str,
              prompt: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`cline auth` with looptrace as an OpenAI-compatible provider, then `cline -y PROMPT` (every
    action approved; the run ends when the model calls submit_and_exit)."""
    env = client_env(home, api_key, CLINE_DIR=str(cline_dir(home)))
    auth = subprocess.run([str(harnesses.cline), "auth", "-p", "openai", "-k", api_key, "-m", model, "-b", base_url],
                          env=env, cwd=workdir, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout)
    if auth.returncode != 0:
        return auth
    return subprocess.run([str(harnesses.cline), "-y", *args, prompt], env=env, cwd=workdir,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)


# -- the agent SDKs, each a short script in their environment --

def run_sdk(harnesses: Harnesses, home: Path, workdir: Path, script: str, api_key: str, timeout: float = 120,
            **env: str) -> subprocess.CompletedProcess:
    """`script` run by the SDKs' Python in a bare environment (`env` added: base URLs, the model)."""
    return subprocess.run([str(harnesses.sdk_python), "-c", script], env=client_env(home, api_key, **env),
                          cwd=workdir, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)


__all__ = ["API_KEY_ENV", "Harnesses", "install", "run_copilot", "run_cline", "run_sdk"]

if __name__ == "__main__":
    installed = install()
    for name in ("copilot", "cline", "sdk_python"):
        print(f"{name}: {getattr(installed, name)}")
