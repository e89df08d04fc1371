"""Debian's PostgreSQL for the tests: the cluster started, a role and a database of the tests' own, a
fresh schema per store.

    python tests/support/postgres.py   (tests/run.sh: starts the cluster, prints the URL without its password)

Local connections are peer-authenticated (`runuser -u postgres -- psql`); the tests connect over
127.0.0.1 with a password, as looptrace would to a server elsewhere. The password is made afresh
each time the role is set up and written nowhere but the test cache (0600), never into the
repository. The unit tests take `prepared_url()` (no process started); `url()` starts the cluster
where it is stopped, and `stop()` and `start()` stop and start it (the integration outage test).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import uuid
from urllib.parse import quote

import build_cache
import waiting

ROLE, DATABASE = "looptrace_test", "looptrace_test"
PORT = int(os.environ.get("LOOPTRACE_TEST_PG_PORT", "5432"))


class Unavailable(RuntimeError):
    """No PostgreSQL here that the tests can start and own (not installed, or not root)."""


def _cluster() -> tuple[str, str]:
    """(version, name) of the installed cluster."""
    if shutil.which("pg_lsclusters") is None:
        raise Unavailable("PostgreSQL is not installed (tests/run.sh installs Debian's)")
    lines = subprocess.run(["pg_lsclusters", "--no-header"], capture_output=True, text=True, check=True).stdout.split("\n")
    clusters = [line.split() for line in lines if line.strip()]
    if not clusters:
        raise Unavailable("PostgreSQL has no cluster (pg_createcluster)")
    return clusters[0][0], clusters[0][1]


def _privileged(command: list[str], user: str | None = None) -> list[str]:
    """`command` as root (or as `user`): directly when this is root, through sudo otherwise."""
    if os.geteuid() == 0:
        return ["runuser", "-u", user, "--", *command] if user else command
    if shutil.which("sudo") is None:
        raise Unavailable("starting PostgreSQL and setting up the test role need root or sudo")
    return ["sudo", "-n", *(["-u", user] if user else []), *command]


def _ctl(action: str) -> None:
    version, name = _cluster()
    subprocess.run(_privileged(["pg_ctlcluster", "--skip-systemctl-redirect", version, name, action]), check=True,
                   capture_output=True, timeout=120)


def running() -> bool:
    version, name = _cluster()
    out = subprocess.run(["pg_lsclusters", "--no-header", version, name], capture_output=True, text=True).stdout
    return " online" in out


def start() -> None:
    if not running():
        _ctl("start")
    def accepting() -> bool:
        return subprocess.run(["pg_isready", "-h", "127.0.0.1", "-p", str(PORT)], capture_output=True).returncode == 0

    try:
        waiting.wait_until(accepting, 60, every=0.2)
    except AssertionError:
        raise Unavailable("PostgreSQL did not accept connections within 60 s") from None


def stop() -> None:
    _ctl("stop")


def _psql(sql: str, database: str = "postgres") -> str:
    """As the postgres user: local connections are peer-authenticated."""
    done = subprocess.run(_privileged(["psql", "-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1", "-d", database, "-c", sql],
                                      user="postgres"), capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"psql: {done.stderr.strip()}")
    return done.stdout.strip()


def url() -> str:
    """The tests' database, its role set up (once per cache: the password is kept in the cache)."""
    start()
    secret = build_cache.cache_root() / "postgres-password"
    if not secret.exists() or not _role_works(secret.read_text().strip()):
        password = secrets.token_urlsafe(24)
        exists = _psql(f"SELECT 1 FROM pg_roles WHERE rolname = '{ROLE}'")
        _psql(f"{'ALTER' if exists else 'CREATE'} ROLE {ROLE} LOGIN PASSWORD '{password}'")
        if not _psql(f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}'"):
            _psql(f"CREATE DATABASE {DATABASE} OWNER {ROLE}")
        secret.parent.mkdir(parents=True, exist_ok=True)
        secret.touch(mode=0o600)
        secret.write_text(password)
    return _url(secret.read_text().strip())


def prepared_url() -> str:
    """The tests' database as tests/run.sh (this module, run as a script) left it: read from the test
    cache and connected to, nothing started (the unit tests start no process)."""
    secret = build_cache.cache_root() / "postgres-password"
    if not secret.exists():
        raise Unavailable("the tests' PostgreSQL is not set up: run tests/support/postgres.py (tests/run.sh does)")
    if not _role_works(secret.read_text().strip()):
        raise Unavailable("the tests' PostgreSQL does not answer on 127.0.0.1: run tests/support/postgres.py "
                          "(tests/run.sh does), which starts it")
    return _url(secret.read_text().strip())


def _url(password: str, database: str = DATABASE, options: str = "") -> str:
    return f"postgresql://{ROLE}:{quote(password, safe='')}@127.0.0.1:{PORT}/{database}{options}"


def _role_works(password: str) -> bool:
    import psycopg

    try:
        psycopg.connect(_url(password), connect_timeout=5).close()
        return True
    except psycopg.Error:
        return False


def fresh_schema(base: str) -> str:
    """A URL whose tables go in a new, empty schema of the tests' database (search_path)."""
    import psycopg

    schema = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    return f"{base}?options={quote(f'-csearch_path={schema}', safe='')}"


def drop_schema(base: str, schema_url: str) -> None:
    import psycopg

    schema = schema_url.rsplit("%3D", 1)[-1]
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


if __name__ == "__main__":
    from looptrace.trace_store.urls import redacted

    print("PostgreSQL for the tests:", redacted(url()))
