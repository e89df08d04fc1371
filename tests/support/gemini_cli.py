"""Gemini CLI (`@google/gemini-cli`, pinned), installed from npm once into the test cache and run in a
bare environment pointed at looptrace's Gemini API, with API-key auth pinned in its settings (0.61
refuses the gateway auth type it picks by itself for a base URL) and its telemetry, usage statistics
and update checks off.

`python tests/support/gemini_cli.py` installs it (tests/run.sh does, before the tests); the tests
install it on first use too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from clients import npm_packages

GEMINI_CLI = "@google/gemini-cli@0.61.0"  # the version issue 56 was tried with
SETTINGS = {"security": {"auth": {"selectedType": "gemini-api-key"}},
            "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
            "privacy": {"usageStatisticsEnabled": False}, "telemetry": {"enabled": False}}


def install() -> Path:
    """The `gemini` program, installed once per cache (clients.npm_packages)."""
    return npm_packages("npm-gemini-cli", (GEMINI_CLI,)) / "node_modules" / ".bin" / "gemini"


def run(program: Path, home: Path, work: Path, base_url: str, api_key: str, model: str, prompt: str,
        timeout: float = 300) -> subprocess.CompletedProcess:
    """One headless prompt (`-p`), its tools approved (`--yolo`); `base_url` the server's root (the CLI
    adds /v1beta/models/…)."""
    (home / ".gemini").mkdir(parents=True, exist_ok=True)
    (home / ".gemini" / "settings.json").write_text(json.dumps(SETTINGS))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8", "TERM": "dumb",
           "GEMINI_API_KEY": api_key, "GOOGLE_GEMINI_BASE_URL": base_url,
           "GEMINI_CLI_TRUST_WORKSPACE": "true",  # 0.61 headless: the folder is trusted without asking
           "NO_BROWSER": "1"}
    return subprocess.run([str(program), "-m", model, "--yolo", "-p", prompt], cwd=work, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)


if __name__ == "__main__":
    print(install())
