"""Modules small enough to hold in one's head, functions that fit on a screen: no source module over
400 lines, no function over 80 (../shared/STYLE.md; issue 25). A module that grows past it is split by concept."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("proxy", "backends", "families", "trace_store", "common")
MODULE_LINES, FUNCTION_LINES = 400, 80


def _sources() -> list[Path]:
    return sorted(p for folder in PACKAGES for p in (ROOT / folder).rglob("*.py"))


def _long_functions(tree: ast.AST) -> list[tuple[str, int, int]]:
    return [(node.name, node.lineno, node.end_lineno - node.lineno + 1) for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > FUNCTION_LINES]


def test_no_module_is_over_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in _sources() if (n := len(p.read_text().splitlines())) > MODULE_LINES}
    assert not long, long


def test_no_function_is_over_80_lines():
    long = [f"{p.relative_to(ROOT)}:{line} {name} ({n} lines)" for p in _sources()
            for name, line, n in _long_functions(ast.parse(p.read_text()))]
    assert not long, "\n".join(long)


def test_the_function_check_measures_what_it_says():
    body = "\n".join(f"    x = {i}" for i in range(FUNCTION_LINES))  # 80 body lines + the def line
    assert [name for name, _, _ in _long_functions(ast.parse(f"def f():\n{body}\n"))] == ["f"]
    assert _long_functions(ast.parse("def g():\n" + "\n".join(body.splitlines()[1:]) + "\n")) == []
