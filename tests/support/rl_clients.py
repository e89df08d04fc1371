"""RL client libraries, each in an environment of its own in the test cache, for checking that they read
looptrace as they read vLLM.

verifiers 0.2.1: the last release whose OpenAI Chat Completions client parses vLLM's `return_token_ids`
and the logprobs out of the response (`OpenAIChatCompletionsClient.from_native_response`); from 0.3 its
training client renders prompts itself and calls vLLM's generate route, and 0.3's copy of the
Chat Completions client is kept as `legacy`. Its own environment: it pins openai 2 and pulls datasets,
mcp and openai-agents, none of which looptrace's environment should carry.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from build_cache import cached

VERIFIERS = "verifiers==0.2.1"
ROLLOUT = Path(__file__).resolve().parent / "verifiers_rollout.py"


def verifiers_python() -> Path:
    """The Python of an environment with verifiers installed, built once (RuntimeError if it cannot be)."""
    def build(out: Path) -> dict:
        subprocess.run([sys.executable, "-m", "venv", str(out / "venv")], check=True)
        done = subprocess.run([str(out / "venv" / "bin" / "python"), "-m", "pip", "install", "-q",
                               "--disable-pip-version-check", VERIFIERS], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"pip install {VERIFIERS} failed: {done.stderr[-3000:]}")
        return {"requirement": VERIFIERS}

    return cached("verifiers-venv", {"requirement": VERIFIERS, "version": 1}, build) / "venv" / "bin" / "python"


def verifiers_rollout(python: Path, base_url: str, model: str, kind: str, prompt: str, sampling: dict,
                      timeout: float = 600) -> dict:
    """verifiers' rollout against `base_url` (verifiers_rollout.py): {"steps": [...], "error": ...}."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "DO_NOT_TRACK": "1"}
    done = subprocess.run([str(python), str(ROLLOUT), base_url, model, kind, prompt, json.dumps(sampling)],
                          capture_output=True, text=True, timeout=timeout, env=env)
    if done.returncode != 0:
        raise AssertionError(f"the verifiers rollout failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
