"""Arize Phoenix, a real OTLP/HTTP receiver, run offline beside a test, with a REST API to read spans back.

Phoenix is large (about 850 MB) and pins its own libraries, so it lives in its own virtual
environment in the test cache, installed once from PyPI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from checkpoints import cache_root
from server import free_port

PHOENIX = "arize-phoenix==20.26.1"


def phoenix_binary() -> Path:
    venv = cache_root() / "phoenix-venv"
    binary = venv / "bin" / "phoenix"
    if not binary.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", PHOENIX], check=True)
    return binary


class Phoenix:
    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        workdir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PHOENIX_WORKING_DIR": str(workdir), "PHOENIX_HOST": "127.0.0.1",
               "PHOENIX_PORT": str(self.port), "PHOENIX_GRPC_PORT": str(free_port()),
               "PHOENIX_TELEMETRY_ENABLED": "false"}
        self.log_path = workdir / "phoenix.log"
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen([str(phoenix_binary()), "serve"], env=env, stdout=self._log,
                                        stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"phoenix exited:\n{self.log_path.read_text()}")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"phoenix not ready:\n{self.log_path.read_text()}")

    def spans(self, trace_id: str, project: str = "default") -> list[dict]:
        spans, cursor = [], None
        while True:
            url = f"{self.url}/v1/projects/{project}/spans?trace_id={trace_id}&limit=1000"
            if cursor:
                url += f"&cursor={cursor}"
            with urllib.request.urlopen(url, timeout=30) as response:
                body = json.loads(response.read())
            spans.extend(body["data"])
            cursor = body.get("next_cursor")
            if not cursor:
                return spans

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self._log.close()
