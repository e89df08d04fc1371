"""The value layers under the parsers: schema typing (tool_schema) and Gemma 4's argument syntax."""

from __future__ import annotations

import pytest

from looptrace.families.gemma4_values import parse_arguments
from looptrace.families.tool_schema import check_arguments, index_tools

Q = '<|"|>'

SCHEMA = {
    "type": "object",
    "properties": {
        "s": {"type": "string"},
        "i": {"type": "integer"},
        "n": {"type": "number"},
        "b": {"type": "boolean"},
        "o": {"type": "object"},
        "a": {"type": "array"},
        "z": {"type": "null"},
        "either": {"type": ["integer", "string"]},
        "maybe": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        "free": {"description": "no type given"},
    },
    "required": ["s"],
}
TOOLS = index_tools([{"type": "function", "function": {"name": "f", "parameters": SCHEMA}}])


@pytest.mark.parametrize(("key", "written", "value"), [
    ("s", "42", "42"),
    ("s", " keep  spaces ", " keep  spaces "),
    ("i", "42", 42),
    ("i", "-7", -7),
    ("i", "3.0", 3),
    ("n", "2.50", 2.5),
    ("n", "1e3", 1000),
    ("b", "true", True),
    ("b", "False", False),
    ("o", '{"k": [1, 2]}', {"k": [1, 2]}),
    ("a", '[1, "x"]', [1, "x"]),
    ("z", "null", None),
    ("either", "5", 5),
    ("either", "five", "five"),
    ("maybe", "null", None),
    ("free", "[1]", [1]),
    ("free", "plain words", "plain words"),
    ("unknown", "{\"x\": 1}", {"x": 1}),
    ("unknown", "NaN", "NaN"),
])
def test_text_values_typed_by_schema(key, written, value):
    args, outcome = check_arguments("f", {"s": "x", key: written}, TOOLS, textual=True)
    assert args[key] == value and type(args[key]) is type(value)
    assert outcome == "valid"


@pytest.mark.parametrize(("key", "written"), [
    ("i", "abc"), ("i", "2.5"), ("i", "1_000"), ("n", "inf"), ("n", "NaN"), ("b", "yes"),
    ("o", "[1]"), ("a", "{}"), ("z", "nil"), ("maybe", "x"),
])
def test_text_values_that_do_not_fit_are_kept_as_written(key, written):
    args, outcome = check_arguments("f", {"s": "x", key: written}, TOOLS, textual=True)
    assert args[key] == written
    assert outcome == "invalid_args"


def test_required_unknown_tool_and_no_tools():
    assert check_arguments("f", {"i": "1"}, TOOLS, textual=True) == ({"i": 1}, "invalid_args")
    assert check_arguments("g", {"i": "1"}, TOOLS, textual=True) == ({"i": 1}, "unknown_tool")
    assert check_arguments("g", {"i": "1"}, None, textual=True) == ({"i": 1}, "valid")
    assert index_tools([]) is None


def test_typed_values_conform():
    args, outcome = check_arguments("f", {"s": "x", "i": "7", "n": 3, "b": True, "z": None}, TOOLS, textual=False)
    assert (args, outcome) == ({"s": "x", "i": 7, "n": 3, "b": True, "z": None}, "valid")
    args, outcome = check_arguments("f", {"s": 5, "b": 1}, TOOLS, textual=False)
    assert (args, outcome) == ({"s": 5, "b": 1}, "invalid_args")


def test_gemma_values():
    text = (f"{{s:{Q}a, b: {{c}}{Q},i:42,f:-1.5,e:1e-3,t:true,n:null,bare:Paris,"
            f"o:{{k:{Q}v{Q},deep:[[1],{{}}]}},l:[1,{Q}x{Q},false,],{Q}quoted{Q}:1,\"json\":\"x,y\"}}")
    assert parse_arguments(text) == {
        "s": "a, b: {c}", "i": 42, "f": -1.5, "e": 0.001, "t": True, "n": None, "bare": "Paris",
        "o": {"k": "v", "deep": [[1], {}]}, "l": [1, "x", False], "quoted": 1, "json": "x,y",
    }
    assert parse_arguments("{}") == {}
    assert parse_arguments(" { a : 1 } ") == {"a": 1}


@pytest.mark.parametrize("text", [
    f"{{s:{Q}unterminated}}", "{a:1 b:2}", "{a:}", "{:1}", "{a:1", "[1]", "{a:1}}", "{a:[1,2}", "{" * 100 + "}" * 100,
])
def test_gemma_malformed_values(text):
    with pytest.raises(ValueError):
        parse_arguments(text)
