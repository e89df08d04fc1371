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
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import build_cache
from clients import MissingNpm

GEMINI_CLI = "@google/gemini-cli@0.61.0"  # the version issue 56 was tried with
SETTINGS = {"security": {"auth": {"selectedType": "gemini-api-key"}},
            "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
            "privacy": {"usageStatisticsEnabled": False}, "telemetry": {"enabled": False}}


def install() -> Path:
    """The `gemini` program, installed once per cache (built in a temporary folder under a file lock and
    renamed into place, as clients.py installs the others)."""
    final = build_cache.cache_root() / f"npm-{GEMINI_CLI.replace('@', '').replace('/', '_')}"
    program = final / "node_modules" / ".bin" / "gemini"
    if program.exists():
        return program
    npm = shutil.which("npm")
    if npm is None:
        raise MissingNpm("npm is not installed: the Gemini CLI test needs it")
    final.parent.mkdir(parents=True, exist_ok=True)
    with build_cache.locked(final.parent / f".{final.name}.lock"):
        if final.is_dir():
            return program
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
        try:
            subprocess.run([npm, "install", "--prefix", str(tmp), "--no-audit", "--no-fund", "--loglevel=error",
                            GEMINI_CLI], check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900)
            os.chmod(tmp, 0o755)
            os.rename(tmp, final)
        except subprocess.CalledProcessError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise RuntimeError(f"npm install failed:\n{exc.stdout.decode(errors='replace')}") from exc
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return program


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
