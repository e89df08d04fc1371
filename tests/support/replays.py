"""What the replay tests share: a real codex session recorded on the tiny agent (tiny_agent.py), the
`looptrace replay` and `looptrace export` commands run as a user runs them, and a direct computation
of where two checkpoints' greedy choices part on a recorded answer."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import clients
import tiny_agent
from server import looptrace_command

MODEL = "agent"
API_KEY = "sk-replay-test"
NUDGE = 0.02  # noise of 2 % of each weight matrix's spread: a few of the agent's greedy choices change


@dataclass
class Recording:
    server: object  # the server.Server that recorded it
    store: Path
    session: str  # the codex session's key
    codex: subprocess.CompletedProcess


def record_codex_session(serve, installed: clients.Clients, folder: Path, checkpoint: Path) -> Recording:
    """codex asked to run a command, against a looptrace serving the tiny agent (local backend)."""
    store = folder / "recorded.sqlite3"
    server = serve(str(checkpoint), "--served-model-name", MODEL, "--trace-db", str(store), api_key=API_KEY)
    home, work = folder / "home", folder / "work"
    home.mkdir()
    work.mkdir()
    clients.codex_home(home, server.base_url, MODEL)
    done = clients.run_codex(installed, home, work, API_KEY, tiny_agent.PROMPT, timeout=600)
    session = server.wait_until(lambda: session_with(server, steps=2), 60)
    return Recording(server, store, session, done)


def session_with(server, steps: int) -> str | None:
    """The key of a stored session with `steps` steps, if the store holds one yet."""
    status, listing = server.get("/v1/sessions")
    return next((s["key"] for s in listing.get("data", []) if s["steps"] >= steps), None) if status == 200 else None


def looptrace(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """A looptrace command, as a user runs it."""
    return subprocess.run([*looptrace_command(), *args], capture_output=True, text=True, timeout=timeout)


def replay(store: Path, session: str, target: str, folder: Path, mode: str = "forced", *extra: str,
           name: str | None = None) -> tuple[subprocess.CompletedProcess, dict, Path]:
    """`looptrace replay`: the process, its JSON report, and where its JUnit file is."""
    name = name or f"{mode}-{int(time.time() * 1000)}"
    report, junit = folder / f"{name}.json", folder / f"{name}.xml"
    done = looptrace("replay", "--store", str(store), "--session", session, "--target", target, "--mode", mode,
                     "--report", str(report), "--junit", str(junit), "--api-key", API_KEY, *extra)
    found = json.loads(report.read_text()) if report.exists() else {}
    return done, found, junit


def outcome(done: subprocess.CompletedProcess) -> str:
    return f"exit {done.returncode}\nstdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"


def greedy_choices(checkpoint: Path, prompt_ids: list[int], answer_ids: list[int]) -> list[int]:
    """The checkpoint's greedy choice at each token of the answer, computed here with transformers."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([prompt_ids + answer_ids[:-1]]), logits_to_keep=len(answer_ids))
    return out.logits[0].argmax(dim=-1).tolist()


def first_parting(a: Path, b: Path, steps: list[tuple[list[int], list[int]]]) -> tuple[dict | None, int]:
    """Where two checkpoints' greedy choices first differ over (prompt, answer) steps, and in how many
    tokens they agree: the direct computation a forced replay is checked against."""
    first, agreeing = None, 0
    for n, (prompt, answer) in enumerate(steps, 1):
        x, y = greedy_choices(a, prompt, answer), greedy_choices(b, prompt, answer)
        agreeing += sum(i == j for i, j in zip(x, y))
        if first is None:
            token = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), None)
            if token is not None:
                first = {"step": n, "token": token}
    return first, agreeing


if __name__ == "__main__":  # builds the tiny agent into the test cache (CI: tests/run.sh may call it)
    print(tiny_agent.agent_checkpoint(), file=sys.stderr)
