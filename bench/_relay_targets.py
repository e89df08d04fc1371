"""The processes the relay benchmark puts between its client and the upstream, and their CPU time.

- the upstream: the vLLM test double in --fast mode (tests/support/vllm_double.py), no model time;
- looptrace: `looptrace serve --backend vllm`, tracing on (a SQLite store) or off;
- LiteLLM's proxy, installed on first use into its own virtual environment in the test cache (it
  pins many packages; the project's environment must not get them), its OpenTelemetry callback
  exporting OTLP/HTTP to a counting sink (bench/_otlp_sink.py), so the export is real and checked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from build_cache import cache_root
from processes import Service, answers_ok, free_port
from server import Server

from looptrace.proxy.settings import Settings

# 1.108.7: the newest LiteLLM whose [proxy] extra installs from this machine's index (1.108.8 and
# later pin litellm-proxy-extras releases it lacks, 1.110 a separate litellm-proxy package), and
# the one the brief's measurement used. The OTLP/HTTP exporter is not one of its dependencies.
LITELLM = ("litellm[proxy]==1.108.7", "opentelemetry-sdk==1.45.2", "opentelemetry-exporter-otlp-proto-http==1.45.2")
# LiteLLM's proxy refuses to start without a master key; requests carry it (sent to every target).
MASTER_KEY = "sk-looptrace-relay-bench-7f3c9a1e5b2d4c6f8a0e"
RENDER_CHECK_EVERY = Settings().render_check_every  # looptrace's default
BENCH = Path(__file__).resolve().parent


# ---------------------------------------------------------------------------------------------
# CPU time from /proc
# ---------------------------------------------------------------------------------------------


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()  # the name may hold spaces


def descendants(pid: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents.setdefault(int(_stat(int(entry.name))[1]), []).append(int(entry.name))
            except (OSError, IndexError):
                pass  # gone while we looked
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU of a process, all its threads, its live descendants and its reaped children:
    a proxy that hands work to a child process (a worker, an exporter) is charged for it too."""
    ticks = 0
    for member in (pid, *descendants(pid)):
        try:
            fields = _stat(member)
        except OSError:
            continue
        ticks += sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
    return ticks / os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------------------------


def looptrace(upstream_url: str, trace_db: str, logs: Path, workers: int = 1) -> Server:
    # Log level info: the workers' "ready" lines are what await_workers reads.
    # --render-check-every as served (the tests' Server checks every prompt, a whole second encoding on each one).
    return Server("--backend", "vllm", "--vllm-url", upstream_url, "--trace-db", trace_db, "--workers", str(workers),
                  "--render-check-every", str(RENDER_CHECK_EVERY), log_dir=logs)


def await_workers(server: Server, workers: int, timeout: float) -> None:
    """Until every worker has loaded (/health answers as soon as one has); one process is ready already."""
    from server_workers import all_ready

    if workers > 1:
        server.wait_until(lambda: all_ready(server.log(), workers), timeout)


class OTLPSink(Service):
    """bench/_otlp_sink.py in a process of its own."""

    name = "the OTLP sink"

    def __init__(self, logs: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        super().__init__([sys.executable, str(BENCH / "_otlp_sink.py"), str(self.port)], logs / "otlp-sink.log")
        self.wait_until(lambda: answers_ok(self.url + "/counts"), 60)

    def counts(self) -> dict:
        with urllib.request.urlopen(self.url + "/counts", timeout=10) as response:
            return json.loads(response.read())


def litellm_binary() -> Path:
    venv = cache_root() / "litellm-venv"
    stamp = venv / "looptrace-requirements.txt"  # written last: a half-done install is redone
    if not stamp.exists() or stamp.read_text() != "\n".join(LITELLM):
        print(f"installing {' '.join(LITELLM)} into {venv} (once)", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *LITELLM], check=True)
        stamp.write_text("\n".join(LITELLM))
    return venv / "bin" / "litellm"


def litellm_version() -> str:
    python = litellm_binary().parent / "python"
    done = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
                          capture_output=True, text=True, check=True)
    return done.stdout.strip()


class LiteLLM(Service):
    """`litellm --config config.yaml`, one worker, quiet, the upstream as an OpenAI-compatible model,
    its OpenTelemetry callback ("otel", LiteLLM's OpenTelemetry v1 integration) on and exporting
    OTLP/HTTP protobuf to `sink_url` (OTEL_EXPORTER=otlp_http, OTEL_ENDPOINT; without them it prints
    spans to the console)."""

    name = "LiteLLM"

    def __init__(self, upstream_url: str, model: str, sink_url: str, logs: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        workdir = logs / "litellm"
        workdir.mkdir(exist_ok=True)
        config = {  # JSON is YAML
            "model_list": [{"model_name": model, "litellm_params": {
                "model": f"openai/{model}", "api_base": f"{upstream_url}/v1", "api_key": "none"}}],
            "litellm_settings": {"callbacks": ["otel"], "set_verbose": False},
        }
        (workdir / "config.yaml").write_text(json.dumps(config, indent=2))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "LITELLM_", "PYTHON"))}
        env.update(LITELLM_MASTER_KEY=MASTER_KEY, LITELLM_LOG="ERROR",
                   LITELLM_LOCAL_MODEL_COST_MAP="True",  # no fetch of the price list from GitHub at start
                   OTEL_EXPORTER="otlp_http", OTEL_ENDPOINT=f"{sink_url}/v1/traces")
        super().__init__(
            [str(litellm_binary()), "--config", "config.yaml", "--host", "127.0.0.1", "--port", str(self.port),
             "--num_workers", "1"], workdir / "litellm.log", cwd=workdir, env=env, inherit_env=False)

    def wait_ready(self, timeout: float = 180) -> None:
        self.wait_until(lambda: answers_ok(self.url + "/health/liveliness"), timeout)
