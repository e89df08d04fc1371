"""compose/postgres.yaml checked by the programs that read it, without Docker: the Compose
specification's schema, and the entrypoint turning its settings into arguments that `looptrace serve`
itself accepts (the shared store; workers only where looptrace relays to vLLM)."""

from __future__ import annotations

from compose_stack import POSTGRES_FILE, postgres_stack, raw_stack
from looptrace.proxy.cli import build_parser, settings_from

from .test_compose_schema import _entrypoint, validate

STORE = "postgresql://looptrace@postgres:5432/looptrace"


def test_the_postgres_file_matches_the_compose_specification():
    done = validate(POSTGRES_FILE)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_relay_gets_the_shared_store_and_workers(tmp_path):
    env = postgres_stack(raw_stack(), {"LOOPTRACE_DB_PASSWORD": "x"})["services"]["looptrace"]["environment"]
    args = _entrypoint(tmp_path, {"VLLM_HOST": "vllm.invalid", "LOOPTRACE_VLLM_URL": "http://vllm:8000",
                                  "LOOPTRACE_TRACE_DB": env["LOOPTRACE_TRACE_DB"],
                                  "LOOPTRACE_WORKERS": env["LOOPTRACE_WORKERS"]})
    assert args[-4:] == ["--trace-db", STORE, "--workers", "2"]
    settings = settings_from(build_parser().parse_args(args))
    assert (settings.trace_db, settings.workers, settings.backend) == (STORE, 2, "vllm")


def test_the_stack_s_own_store_gives_way_to_the_shared_one(tmp_path):
    # compose.yaml's command names /data/traces.sqlite3; the entrypoint's --trace-db comes after it.
    args = _entrypoint(tmp_path, {"VLLM_HOST": "vllm.invalid", "LOOPTRACE_VLLM_URL": "http://vllm:8000",
                                  "LOOPTRACE_TRACE_DB": STORE})
    command = args[:-2] + ["--trace-db", "/data/traces.sqlite3"] + args[-2:]
    assert settings_from(build_parser().parse_args(command)).trace_db == STORE


def test_a_local_model_stays_one_process(tmp_path):
    args = _entrypoint(tmp_path, {"VLLM_HOST": "vllm.invalid", "LOOPTRACE_TRACE_DB": STORE, "LOOPTRACE_WORKERS": "2"})
    assert "--workers" not in args and args[-2:] == ["--trace-db", STORE]
