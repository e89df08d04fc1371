"""compose/ checked by the programs that read it, without Docker: the compose files against the Compose
specification's schema (check-jsonschema ships it; without it these tests fail, they never skip), the
entrypoint script's backend switch run by `sh`, and the Prometheus config by promtool. What is read in
this process is in tests/unit/test_compose.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from compose_stack import (
    COMPOSE_DIR,
    COMPOSE_FILE,
    TWO_VLLM_FILE,
    command_words,
    option,
    port_mappings,
    raw_stack,
    two_vllm_stack,
)


@pytest.fixture(scope="module")
def two_vllm() -> dict:
    return two_vllm_stack(raw_stack())


def check_jsonschema() -> str:
    exe = shutil.which("check-jsonschema", path=str(Path(sys.executable).parent)) or shutil.which("check-jsonschema")
    if exe is None:
        pytest.fail("check-jsonschema is not installed (it ships the Compose specification's schema): "
                    "pip install -e '.[test]'")
    return exe


def validate(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([check_jsonschema(), "--builtin-schema", "vendor.compose-spec", str(path)],
                          capture_output=True, text=True, timeout=120)


def test_compose_file_matches_the_compose_specification():
    done = validate(COMPOSE_FILE)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_schema_check_catches_a_misspelt_key(tmp_path):
    # The validation above can fail: the same file with one misspelt healthcheck key does not pass.
    broken = tmp_path / "compose.yaml"
    text = COMPOSE_FILE.read_text()
    assert "start_period:" in text
    broken.write_text(text.replace("start_period:", "start_perod:", 1))
    done = validate(broken)
    assert done.returncode != 0 and "start_perod" in done.stdout, done.stdout + done.stderr


def _entrypoint(tmp_path: Path, env: dict[str, str]) -> list[str]:
    """The arguments the entrypoint hands `looptrace`, which here only prints them."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "looptrace"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    fake.chmod(0o755)
    environment = {"PATH": f"{bin_dir}:{os.environ['PATH']}", **env}
    done = subprocess.run(["sh", str(COMPOSE_DIR / "looptrace-entrypoint.sh"), "Org/Model", "--port", "8000"],
                          capture_output=True, text=True, env=environment, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_entrypoint_forwards_to_vllm_when_the_service_resolves(tmp_path):
    if shutil.which("getent") is None:
        pytest.fail("getent (libc-bin) is missing; the image has it and so must this machine")
    assert _entrypoint(tmp_path, {"VLLM_HOST": "localhost"}) == [
        "serve", "--backend", "vllm", "--vllm-url", "http://localhost:8000", "Org/Model", "--port", "8000"]


def test_entrypoint_decodes_locally_without_the_vllm_service(tmp_path):
    # A name under .invalid never resolves (RFC 2606), as `vllm` does not without the gpu profile.
    assert _entrypoint(tmp_path, {"VLLM_HOST": "vllm.invalid"}) == ["serve", "Org/Model", "--port", "8000"]


def test_entrypoint_takes_an_explicit_vllm_url(tmp_path):
    args = _entrypoint(tmp_path, {"VLLM_HOST": "vllm.invalid", "LOOPTRACE_VLLM_URL": "http://gpu-box:8000"})
    assert args[:5] == ["serve", "--backend", "vllm", "--vllm-url", "http://gpu-box:8000"]


def test_entrypoint_takes_several_vllm_urls(tmp_path):
    args = _entrypoint(tmp_path, {"VLLM_HOST": "vllm.invalid",
                                  "LOOPTRACE_VLLM_URL": "http://node-a:8000, http://node-b:8000 http://node-c:8000"})
    assert args == ["serve", "--backend", "vllm", "--vllm-url", "http://node-a:8000", "--vllm-url",
                    "http://node-b:8000", "--vllm-url", "http://node-c:8000", "Org/Model", "--port", "8000"]


def test_two_vllm_file_matches_the_compose_specification():
    done = validate(TWO_VLLM_FILE)
    assert done.returncode == 0, done.stdout + done.stderr


def test_looptrace_is_given_both_servers_and_prometheus_scrapes_both(two_vllm, tmp_path):
    services = two_vllm["services"]
    looptrace = services["looptrace"]
    urls = looptrace["environment"]["LOOPTRACE_VLLM_URL"].split()
    ports = {n: option(command_words(services[n]["command"]), "--port") for n in ("vllm", "vllm-2")}
    assert urls == [f"http://{n}:{p}" for n, p in ports.items()]
    assert looptrace["depends_on"]["vllm-2"] == {"condition": "service_healthy", "required": False}
    assert looptrace["depends_on"]["tempo"]["condition"] == "service_healthy"  # the base's kept
    args = _entrypoint(tmp_path, {"VLLM_HOST": "vllm.invalid", "LOOPTRACE_VLLM_URL": " ".join(urls)})
    assert args[:7] == ["serve", "--backend", "vllm", "--vllm-url", urls[0], "--vllm-url", urls[1]]
    config = yaml.safe_load((COMPOSE_DIR / "prometheus.yml").read_text())
    vllm_job = next(j for j in config["scrape_configs"] if j["job_name"] == "vllm")
    assert set(vllm_job["dns_sd_configs"][0]["names"]) == {"vllm", "vllm-2"}
    published = [port_mappings(s)[0][1] for s in services.values() if port_mappings(s)]
    assert len(published) == len(set(published)), "two services publish the same host port"


def test_prometheus_config_passes_promtool():
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed: `apt-get install prometheus` (Debian) — tests/run.sh does it")
    done = subprocess.run([promtool, "check", "config", str(COMPOSE_DIR / "prometheus.yml")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
