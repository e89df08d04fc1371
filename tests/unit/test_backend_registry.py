"""The backend registry is the one place that knows backends by name: the server reads them through
their entries (options, checks, needs, capabilities, loader) and the Backend protocol."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from looptrace.backends import registry
from looptrace.backends.base import Loader
from looptrace.proxy.cli import DEFAULTS, build_parser, settings_from

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [p for folder in ("proxy", "backends", "families", "trace_store", "common") for p in (ROOT / folder).rglob("*.py")]
NAMES = set(registry.names())


def _compared_names(tree: ast.AST) -> list[tuple[int, str]]:
    """String constants that are backend names, where they take part in a comparison (==, !=, in)."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        for operand in (node.left, *node.comparators):
            values = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand]
            found += [(node.lineno, v.value) for v in values
                      if isinstance(v, ast.Constant) and isinstance(v.value, str) and v.value in NAMES]
    return found


def test_no_backend_name_is_compared_outside_the_registry():
    offenders = [f"{path.relative_to(ROOT)}:{line}: {name!r}" for path in SOURCES
                 if path.name != "registry.py" for line, name in _compared_names(ast.parse(path.read_text()))]
    assert not offenders, "compare entries' capabilities, not names:\n" + "\n".join(offenders)


def test_the_check_finds_a_comparison():
    # The test above is only as good as its finder.
    assert _compared_names(ast.parse('if backend.name == "vllm" or kind in ("local", "x"): pass')) == [
        (1, "vllm"), (1, "local")]


@pytest.mark.parametrize("entry", registry.ENTRIES, ids=lambda e: e.name)
def test_each_entry_names_a_loader_that_exists(entry):
    import importlib

    module, _, name = entry.loader.partition(":")
    assert issubclass(getattr(importlib.import_module(module), name), Loader)


def test_an_option_of_another_backend_is_refused_naming_who_reads_it():
    parse = build_parser().parse_args
    settings = settings_from(parse(["serve", "m", "--backend", "replay", "--replay", "f", "--max-queue", "3"]))
    assert registry.refusal(settings, DEFAULTS) == "--max-queue is for --backend local and llama.cpp"
    settings = settings_from(parse(["serve", "--backend", "vllm", "--vllm-url", "http://a", "--speculative-config",
                                    "{}"]))
    assert "a vLLM server takes its own" in registry.refusal(settings, DEFAULTS)


def test_each_backend_checks_its_own_options():
    parse = build_parser().parse_args
    assert registry.refusal(settings_from(parse(["serve", "m", "--backend", "replay"])), DEFAULTS) == \
        "--backend replay needs --replay FILE"
    twice = parse(["serve", "--backend", "vllm", "--vllm-url", "http://a:1/v1", "--vllm-url", "http://a:1"])
    assert "named twice" in registry.refusal(settings_from(twice), DEFAULTS)
    bad = parse(["serve", "m.gguf", "--backend", "llama.cpp", "--threads", "0"])
    assert registry.refusal(settings_from(bad), DEFAULTS) == "--threads must be at least 1"
    fine = parse(["serve", "m", "--backend", "local", "--speculative-config",
                  '{"method": "ngram", "num_speculative_tokens": 3}'])
    assert registry.refusal(settings_from(fine), DEFAULTS) is None


def test_the_command_lines_defaults_are_the_settings():
    args = build_parser().parse_args(["serve"])
    settings = settings_from(args)
    for option, _ in registry.options():
        assert getattr(settings, option.dest) == getattr(DEFAULTS, option.dest), option.dest
    assert settings.port == DEFAULTS.port and settings.trace_max_mb == DEFAULTS.trace_max_mb


def test_model_defaults_by_backend():
    parse = build_parser().parse_args
    assert settings_from(parse(["serve"])).model == DEFAULTS.model
    assert settings_from(parse(["serve", "--backend", "vllm", "--vllm-url", "http://a"])).model is None
