"""README.md and the manual in docs/ stay true: README's commands are the ones CI runs, and the manual's
pages name every option (serve.md), metric (metrics.md), span (traces.md) and route (endpoints.md)."""

from __future__ import annotations

import re
from pathlib import Path

from manual import page

from looptrace.proxy.cli import build_parser
from looptrace.proxy.observe.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def indented_commands() -> list[str]:
    """The indented commands before README's first section."""
    return [line.strip() for line in README.split("\n## ")[0].splitlines() if line.startswith("    ")]


def test_it_starts_with_the_serve_and_test_commands():
    serve, test = indented_commands()
    assert serve.endswith("looptrace serve") and "pip install torch==2.13.0" in serve
    # The default backend decodes here: the local extra, after the CPU torch (which it then keeps).
    assert serve.index("pip install torch==2.13.0") < serve.index("pip install -e '.[local]'")
    assert test == "tests/run.sh"
    # CI runs exactly the README's test command.
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == f"exec {test}"
    script = (ROOT / test).read_text()
    assert script.index("pip install -q torch==2.13.0") < script.index("pip install -q -e '.[local,test]'")


def test_every_serve_option_is_documented():
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]
    flags = {s for action in serve._actions for s in action.option_strings if s.startswith("--") and s != "--help"}
    serve_page = page("serve.md")
    missing = {flag for flag in flags if f"`{flag}" not in serve_page}
    assert len(flags) > 30 and not missing


def test_every_metric_is_documented():
    names = {m.name + ("_total" if m.type == "counter" else "") for m in Metrics().registry.collect()}
    assert names and all(name.startswith("looptrace_") for name in names)
    metrics_page = page("metrics.md")
    missing = {name for name in names if f"`{name}`" not in metrics_page}
    assert not missing


def test_every_span_is_documented():
    traces_page = page("traces.md")
    for span in ("chat {model}", "responses {model}", "fork {model}", "render", "prefill", "decode",
                 "execute_tool {name}"):
        assert f"`{span}`" in traces_page
    assert re.search(r"`looptrace\.tokens` events", traces_page)


def test_every_route_is_documented():
    from looptrace.proxy.api.app import create_app
    from looptrace.proxy.settings import Settings

    app = create_app(Settings(trace_db="off"))
    paths = {re.sub(r"\{(\w+):[^}]*\}", r"{\1}", resource.canonical) for resource in app.router.resources()}
    paths.discard("/static")  # the viewer's own files
    endpoints_page = page("endpoints.md")
    missing = {path for path in paths if path not in endpoints_page}
    assert len(paths) > 15 and not missing, missing
