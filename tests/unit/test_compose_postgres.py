"""compose/postgres.yaml, merged over the stack as `docker compose -f compose.yaml -f postgres.yaml`
reads it: a pinned PostgreSQL that looptrace waits for, its password from the environment only (none
committed, none on a command line), the data on a named volume, nothing published."""

from __future__ import annotations

import re

import pytest

from compose_stack import POSTGRES_FILE, mounts, port_mappings, postgres_stack, raw_stack
from looptrace.trace_store.location import parse

SECRET = "correct-horse-battery-staple"


@pytest.fixture(scope="module")
def stack() -> dict:
    return postgres_stack(raw_stack(), {"LOOPTRACE_DB_PASSWORD": SECRET})


def test_the_password_comes_from_the_environment_and_is_required():
    with pytest.raises(KeyError, match="LOOPTRACE_DB_PASSWORD"):
        postgres_stack(raw_stack(), {})
    text = POSTGRES_FILE.read_text()
    assert re.findall(r"PASSWORD: (\S+)", text) == ["${LOOPTRACE_DB_PASSWORD:?set"] * 2


def test_looptrace_waits_for_postgresql_and_names_it_without_the_password(stack):
    services = stack["services"]
    postgres, looptrace = services["postgres"], services["looptrace"]
    assert re.fullmatch(r"postgres:\d+\.\d+", postgres["image"])  # PostgreSQL's releases are MAJOR.MINOR
    assert looptrace["depends_on"]["postgres"] == {"condition": "service_healthy"}
    assert looptrace["depends_on"]["tempo"]["condition"] == "service_healthy"  # the base's kept
    assert postgres["healthcheck"]["test"][:2] == ["CMD", "pg_isready"]
    env = looptrace["environment"]
    location = parse(env["LOOPTRACE_TRACE_DB"])
    assert location.kind == "postgresql" and SECRET not in location.target
    user, database = postgres["environment"]["POSTGRES_USER"], postgres["environment"]["POSTGRES_DB"]
    assert location.target == f"postgresql://{user}@postgres:5432/{database}"
    assert env["PGPASSWORD"] == postgres["environment"]["POSTGRES_PASSWORD"] == SECRET  # libpq reads PGPASSWORD
    assert env["LOOPTRACE_WORKERS"] == "2" and env["LOOPTRACE_API_KEY"] == ""  # the base's environment kept
    assert all(SECRET not in str(v) for s in services.values() for v in (s.get("command"), s.get("entrypoint")))


def test_the_database_lives_on_a_named_volume_and_is_not_published(stack):
    postgres = stack["services"]["postgres"]
    assert dict(mounts(postgres)) == {"postgres-data": "/var/lib/postgresql/data"}
    assert "postgres-data" in stack["volumes"] and "traces" in stack["volumes"]
    assert port_mappings(postgres) == []
