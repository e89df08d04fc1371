"""Running a real `looptrace serve` process for a test module, and talking to it."""

from __future__ import annotations

import json
import shutil
import sys
import urllib.error
import urllib.request
from pathlib import Path

from processes import Service, free_port

ROOT = Path(__file__).resolve().parents[2]
__all__ = ["Server", "free_port", "sse_events"]


def looptrace_command() -> list[str]:
    exe = shutil.which("looptrace", path=str(Path(sys.executable).parent)) or shutil.which("looptrace")
    return [exe] if exe else [sys.executable, "-m", "looptrace.proxy.cli"]


class Server(Service):
    """`looptrace serve ARGS` on a free port; its log goes to a file shown when it fails."""

    name = "looptrace"

    def __init__(self, *args: str, log_dir: Path, env: dict | None = None, api_key: str | None = None,
                 program: list[str] | None = None) -> None:
        self.port = free_port()
        self.api_key = api_key
        # `program`: another install's looptrace (a relay's, without torch: relay_install.py)
        command = [*(program or looptrace_command()), "serve", *args, "--port", str(self.port)]
        if "--trace-db" not in args:  # never the user's own store
            self.trace_db = log_dir / f"traces-{self.port}.sqlite3"
            command += ["--trace-db", str(self.trace_db)]
        if api_key:
            command += ["--api-key", api_key]
        if "--render-check-every" not in args:
            # Every prompt encoded from its conversation's previous one is checked against a whole
            # encoding: every test with a real harness is then a test of incremental encoding too
            # (conftest.py's `serve` fails a module whose servers counted a difference).
            command += ["--render-check-every", "1"]
        super().__init__(command, log_dir / f"looptrace-{self.port}.log", env=env, cwd=ROOT)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def wait_ready(self, timeout: float = 300) -> dict:
        health: dict = {}

        def ready() -> bool:
            nonlocal health
            status, health = self.get("/health")
            if health.get("status") == "failed":
                raise RuntimeError(f"looptrace failed to load: {health}\n{self.log()}")
            return status == 200

        self.wait_until(ready, timeout)
        return health

    def request(self, method: str, path: str, body: object | None = None, *, raw: bytes | None = None,
                headers: dict | None = None, timeout: float = 120) -> tuple[int, dict]:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        all_headers = {"Content-Type": "application/json"}
        if self.api_key:
            all_headers["Authorization"] = f"Bearer {self.api_key}"
        all_headers.update(headers or {})
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=all_headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as response:
                return response.status, _json(response.read())
        except urllib.error.HTTPError as err:
            return err.code, _json(err.read())
        except (ConnectionError, urllib.error.URLError):
            return 0, {}

    def newest_trace_id(self) -> str | None:
        status, listing = self.get("/v1/traces?limit=1")
        return listing["data"][0]["trace_id"] if status == 200 and listing["data"] else None

    def trace_after(self, before: str | None, timeout: float = 10) -> dict:
        """The newest stored trace, once it is newer than `before` (`newest_trace_id()` taken before the
        request): the store writes spans off the request's path, a moment after its answer."""
        newest: str | None = None

        def written() -> bool:
            nonlocal newest
            newest = self.newest_trace_id()
            return newest is not None and newest != before

        self.wait_until(written, timeout)
        status, trace = self.get(f"/v1/traces/{newest}")
        assert status == 200, trace
        return trace

    def metric(self, name: str, **labels: str) -> float:
        """One series of /metrics, summed over the labels not given (0 when absent)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as response:
            text = response.read().decode()
        total = 0.0
        for line in text.splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            series, _, value = line.rpartition(" ")
            if all(f'{k}="{v}"' in series for k, v in labels.items()):
                total += float(value)
        return total

    def render_differences(self) -> float:
        """Prompts whose incremental encoding differed from a whole one (see __init__)."""
        return self.metric("looptrace_render_checks_total", result="differed")

    def get(self, path: str, **kw) -> tuple[int, dict]:
        return self.request("GET", path, **kw)

    def post(self, path: str, body: object | None = None, **kw) -> tuple[int, dict]:
        return self.request("POST", path, body, **kw)


def _json(data: bytes) -> dict:
    try:
        value = json.loads(data)
    except json.JSONDecodeError:
        return {"_raw": data.decode(errors="replace")}
    return value if isinstance(value, dict) else {"_value": value}


def sse_events(data: bytes) -> list[dict | str]:
    """The `data:` payloads of an SSE body, parsed; `[DONE]` kept as a string."""
    events: list[dict | str] = []
    for block in data.decode().split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: "):
                payload = line[len("data: "):]
                events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events
