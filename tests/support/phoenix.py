"""Arize Phoenix, a real OTLP/HTTP receiver, run offline beside a test, with a REST API to read spans back.

Phoenix is large (about 850 MB) and pins its own libraries, so it lives in its own virtual
environment in the test cache, installed once from PyPI.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

from build_cache import cache_root
from processes import Service, answers_ok, free_port

PHOENIX = "arize-phoenix==20.26.1"


def phoenix_binary() -> Path:
    venv = cache_root() / "phoenix-venv"
    binary = venv / "bin" / "phoenix"
    if not binary.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", PHOENIX], check=True)
    return binary


class Phoenix(Service):
    name = "phoenix"

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        workdir.mkdir(parents=True, exist_ok=True)
        env = {"PHOENIX_WORKING_DIR": str(workdir), "PHOENIX_HOST": "127.0.0.1",
               "PHOENIX_PORT": str(self.port), "PHOENIX_GRPC_PORT": str(free_port()),
               "PHOENIX_TELEMETRY_ENABLED": "false"}
        super().__init__([str(phoenix_binary()), "serve"], workdir / "phoenix.log", env=env)
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 120) -> None:
        self.wait_until(lambda: answers_ok(self.url + "/healthz"), timeout)

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
