"""The layer contracts in pyproject.toml hold, checked by import-linter in this process (`lint-imports`
by hand). That the installed `looptrace` namespace lives beside other packages, proxy.py's `proxy` among
them, is checked by building and installing the wheel: tests/integration/test_layout.py."""

from __future__ import annotations

import tomllib
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
    contracts = len(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"])
    assert "0 broken" in out and f"{contracts} kept" in out, out  # every contract checked, none skipped


def test_no_module_imports_itself_round_a_circle():
    """No import cycle anywhere in looptrace, imports made only for type checkers included: each
    module's imports run one way (a circle is the thing the layer contracts cannot see inside a layer)."""
    import grimp

    roots = ("looptrace.proxy", "looptrace.families", "looptrace.backends", "looptrace.trace_store", "looptrace.common")
    graph = grimp.build_graph(*roots, exclude_type_checking_imports=False)
    modules = sorted(graph.modules)
    assert len(modules) > 150, modules  # the whole house was read
    index, low, on_stack, stack, circles, counter = {}, {}, set(), [], [], [0]

    def visit(module: str) -> None:  # Tarjan's strongly connected components, written out: a few lines
        index[module] = low[module] = counter[0]
        counter[0] += 1
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in modules:
        if module not in index:
            visit(module)
    assert not circles, circles


def test_every_package_folder_is_one_the_wheel_installs():
    """A package folder missing from pyproject.toml's list installs nothing (setuptools takes the list
    as it is): the wheel would lack it and `import looptrace.proxy.api.app` fail once installed."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {"proxy": "looptrace.proxy", "families": "looptrace.families", "backends": "looptrace.backends",
               "trace_store": "looptrace.trace_store", "common": "looptrace.common"}
    found = {".".join([folders[init.relative_to(ROOT).parts[0]], *init.relative_to(ROOT).parts[1:-1]])
             for folder in folders for init in (ROOT / folder).rglob("__init__.py")}
    assert found == listed, {"missing": sorted(found - listed), "not a folder": sorted(listed - found)}
