"""The layer contracts in pyproject.toml hold, checked by import-linter in this process (`lint-imports`
by hand). That the installed `looptrace` namespace lives beside other packages, proxy.py's `proxy` among
them, is checked by building and installing the wheel: tests/integration/test_layout.py."""

from __future__ import annotations

from pathlib import Path

from importlinter import configuration
from importlinter.application import use_cases

ROOT = Path(__file__).resolve().parents[2]


def test_the_layer_contracts_hold(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)  # import-linter reads the contracts from the pyproject.toml it is run beside
    # Its file readers and graph builder: import-linter 2.17 sets them up only as its cli or api module loads.
    configuration.configure()
    # Its use case, not its command: the command configures logging anew, which silences every logger
    # already made (looptrace's, for the tests after this one), and puts the working folder on sys.path.
    kept = use_cases.lint_imports(cache_dir=None, no_logo=True)
    out = capsys.readouterr().out
    assert kept, out
    assert "0 broken" in out and "6 kept" in out, out
