"""A real vllm-router for the tests: vLLM's own router (PyPI `vllm-router`, a Rust binary in a wheel)
in a virtual environment of its own, built once into the test cache, started in front of real vLLM
servers on a free loopback port.

`python tests/support/real_router.py` builds it (tests/run.sh does, before pytest); the tests build
it on first use too.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from build_cache import cached
from processes import Service, answers_ok, free_port

VLLM_ROUTER = "vllm-router==0.1.17"
ENV_VERSION = 1


def router_command() -> list[str]:
    """How to start it: its environment's Python running the launcher (the `vllm-router` script's
    first line names the folder it was built in, which the cache renames when the build is done)."""
    folder = cached("vllm-router-venv", {"router": VLLM_ROUTER, "version": ENV_VERSION}, _build_env)
    return [str(folder / "venv" / "bin" / "python"), "-m", "vllm_router.launch_router"]


def _build_env(out: Path) -> dict[str, Any]:
    venv = out / "venv"
    for command in ([sys.executable, "-m", "venv", str(venv)],
                    [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                     VLLM_ROUTER]):
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"`{' '.join(command)}` failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return {"router": VLLM_ROUTER}


class RouterServer(Service):
    """`vllm-router --worker-urls URL… --policy POLICY` on a free loopback port."""

    name = "vllm-router"

    def __init__(self, worker_urls: list[str], log_path: Path, policy: str = "consistent_hash") -> None:
        self.port = free_port()
        command = [*router_command(), "--host", "127.0.0.1", "--port", str(self.port), "--worker-urls",
                   *worker_urls, "--policy", policy, "--log-level", "info"]
        super().__init__(command, log_path)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 120) -> RouterServer:
        self.wait_until(lambda: answers_ok(self.url + "/v1/models"), timeout)
        return self


if __name__ == "__main__":
    print(" ".join(router_command()))
