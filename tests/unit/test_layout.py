"""The layer contracts in pyproject.toml hold, checked by import-linter in this process (`lint-imports`
by hand). That the installed `looptrace` namespace lives beside other packages, proxy.py's `proxy` among
them, is checked by building and installing the wheel: tests/integration/test_wheel_layout.py."""

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
    assert f"{len(_contracts())} kept, 0 broken" in out, out


def _contracts() -> list[dict]:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def _graph(external: bool = False):
    import grimp

    # No cache: a graph cached by file times can outlive a `git stash`, and read imports the files no longer have.
    return grimp.build_graph(*ROOTS, include_external_packages=external, exclude_type_checking_imports=False,
                             cache_dir=None)


ROOTS = ("looptrace.proxy", "looptrace.families", "looptrace.backends", "looptrace.trace_store", "looptrace.common")


def test_every_layer_contract_names_every_module_of_its_container():
    """A module a layer contract does not name is held to nothing: a new module must take its floor."""
    graph = _graph()
    unnamed = {}
    for contract in _contracts():
        if contract["type"] != "layers":
            continue
        named = {name.strip() for layer in contract["layers"] for name in layer.split("|")}
        for container in contract.get("containers", []):
            children = {m[len(container) + 1:].split(".")[0] for m in graph.modules if m.startswith(container + ".")}
            if missing := sorted(children - named):
                unnamed[container] = missing
    assert not unnamed, unnamed


def test_no_module_outside_the_sqlite_store_imports_sqlite3():
    """Readers catch the store's own StoreUnavailable, whichever store: a `sqlite3.Error` caught in the
    viewer missed every PostgreSQL failure. (import-linter holds the same as a contract.)"""
    graph = _graph(external=True)
    importers = graph.find_modules_that_directly_import("sqlite3")
    outside = sorted(m for m in importers if not m.startswith("looptrace.trace_store.sqlite"))
    assert importers and not outside, outside


def test_no_module_imports_itself_round_a_circle():
    """No import cycle anywhere in looptrace, imports made only for type checkers included: each
    module's imports run one way (a circle is the thing the layer contracts cannot see inside a layer)."""
    graph = _graph()
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
