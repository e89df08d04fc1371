"""`--trace-db`: a path, `off`, or a PostgreSQL URL; a URL is never a file name, whatever its scheme,
and its password is never shown."""

from __future__ import annotations

import os

import pytest

from looptrace.proxy import cli
from looptrace.trace_store import location


@pytest.mark.parametrize(("setting", "kind"), [
    ("traces.sqlite3", "sqlite"), ("/tmp/x/t.db", "sqlite"), ("~/t.sqlite3", "sqlite"),
    ("postgresql://u:pw@db.example:5432/looptrace", "postgresql"), ("postgres://u@h/db", "postgresql"),
    ("POSTGRESQL://u@h/db", "postgresql"),
])
def test_a_setting_names_a_store(setting, kind):
    assert location.parse(setting).kind == kind
    assert location.parse("off") is None
    assert location.parse(None).target.endswith("traces.sqlite3")


@pytest.mark.parametrize("setting", ["mysql://root:hunter2@db/x", "sqlite:///tmp/t.db", "file:///tmp/t.db",
                                     "http://collector:4318", "redis://:hunter2@cache:6379/0"])
def test_any_other_url_is_refused_naming_what_is_taken(setting):
    with pytest.raises(ValueError) as info:
        location.parse(setting)
    message = str(info.value)
    assert "postgresql://" in message and "'off'" in message and "file path" in message
    assert "hunter2" not in message and setting.split("://")[0].lower() + "://" in message


def test_a_password_is_never_shown():
    shown = location.redacted("postgresql://looptrace:s3cr%40t@db.internal:6543/traces?password=other&sslmode=require")
    assert shown == "postgresql://looptrace@db.internal:6543/traces"
    assert location.Location("postgresql", "postgres://u:pw@[::1]/d").shown == "postgres://u@[::1]/d"
    assert location.redacted("postgresql://db.internal/traces") == "postgresql://db.internal/traces"


def test_the_command_line_refuses_such_a_url_before_anything_is_made(tmp_path, capsys, monkeypatch):
    # Before: `--trace-db mysql://root:pw@db/x` made a folder "mysql:/root:pw@db" holding a SQLite file.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        cli.main(["serve", "--backend", "replay", "--replay", "none.jsonl", "--trace-db", "mysql://root:pw@db/x"])
    assert info.value.code == 2
    error = capsys.readouterr().err
    assert "mysql:// is not a store looptrace can use" in error and "postgresql://" in error
    assert os.listdir(tmp_path) == []


def test_a_postgresql_url_makes_no_file_and_a_server_that_is_not_there_fails_nothing(tmp_path, monkeypatch, caplog):
    from looptrace.proxy.observe.telemetry import Telemetry
    from looptrace.proxy.settings import Settings

    monkeypatch.chdir(tmp_path)
    url = "postgresql://looptrace:pw-never-shown@127.0.0.1:1/traces"  # nothing listens on port 1
    telemetry = Telemetry(Settings(trace_db=url))
    try:
        assert telemetry.store.sink == "postgresql" and telemetry.store.where == "postgresql://looptrace@127.0.0.1:1/traces"
        assert telemetry.state is not None
    finally:
        telemetry.close()
    assert os.listdir(tmp_path) == []
    assert "pw-never-shown" not in caplog.text and "127.0.0.1:1" in caplog.text
