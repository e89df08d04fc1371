"""Typing and checking tool-call arguments against the tools' JSON schemas.

Qwen3.5 writes every argument as plain text, so its types come from the schema: "3" is 3 for an
integer parameter and "3" for a string one. Gemma 4 and Hermes JSON write typed values; those are
checked against the schema the same way (a quoted number for an integer parameter is accepted).
Only the top level of the arguments is checked; nested objects are taken as written.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

VALID, INVALID_ARGS, UNKNOWN_TOOL = "valid", "invalid_args", "unknown_tool"

_FAIL = object()


def index_tools(tools: list[dict] | None) -> dict[str, dict] | None:
    """name → parameters schema, or None when no tools were offered at all."""
    if not tools:
        return None
    index = {}
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        fn = tool.get("function", tool)  # OpenAI shape, or a bare function declaration
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            params = fn.get("parameters")
            index[fn["name"]] = params if isinstance(params, dict) else {}
    return index


def check_arguments(name: str, args: dict, tools: dict[str, dict] | None, textual: bool) -> tuple[dict, str]:
    """Type `args` by the tool's schema; returns (arguments, outcome).

    `textual`: the values are the model's plain text (Qwen3.5), not typed values.
    A value that does not fit its schema is kept (as written) and makes the outcome invalid_args.
    """
    schema = tools.get(name) if tools is not None else None
    if schema is None:
        typed = {k: _loose(v) for k, v in args.items()} if textual else dict(args)
        return typed, (UNKNOWN_TOOL if tools is not None else VALID)
    props = schema.get("properties")
    props = props if isinstance(props, dict) else {}
    ok = True
    typed = {}
    for key, value in args.items():
        prop = props.get(key)
        if not isinstance(prop, dict):
            typed[key] = _loose(value) if textual else value
            continue
        result = coerce_text(value, prop) if textual else conform(value, prop)
        if result is _FAIL:
            ok = False
            typed[key] = value
        else:
            typed[key] = result
    required = schema.get("required")
    if isinstance(required, list) and any(r not in args for r in required):
        ok = False
    return typed, (VALID if ok else INVALID_ARGS)


def _loose(text: str) -> Any:
    """An argument nothing describes: JSON when it parses, else the text itself."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    # json.loads accepts NaN and Infinity, which are not JSON on the way back out.
    if isinstance(value, float) and not math.isfinite(value):
        return text
    return value


def _types(schema: dict) -> list:
    """The alternatives a schema allows, in order: a type list, anyOf/oneOf, or one type."""
    alts = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(alts, list):
        return [a for a in alts if isinstance(a, dict)]
    t = schema.get("type")
    if isinstance(t, list):
        return [{"type": x} for x in t]
    return [schema]


def coerce_text(text: str, schema: dict) -> Any:
    """Plain text → the first type the schema allows that it parses as, or _FAIL. `null` is null
    wherever the schema allows null, before any string reading of it."""
    if text.strip() == "null" and _allows_null(schema):
        return None
    for alt in _types(schema):
        t = alt.get("type")
        if "anyOf" in alt or "oneOf" in alt:
            value = coerce_text(text, alt)
        elif isinstance(t, str) and t in _FROM_TEXT:
            value = _FROM_TEXT[t](text)
        else:
            value = _loose(text)  # no type given: anything goes
        if value is not _FAIL:
            return value
    return _FAIL


def _allows_null(schema: dict) -> bool:
    if schema.get("nullable") is True:  # OpenAPI's way
        return True
    for alt in _types(schema):
        if alt.get("type") == "null" or (("anyOf" in alt or "oneOf" in alt) and _allows_null(alt)):
            return True
    return False


def conform(value: Any, schema: dict) -> Any:
    """A typed value → itself when the schema allows it, a string parsed by type, or _FAIL."""
    for alt in _types(schema):
        t = alt.get("type")
        if "anyOf" in alt or "oneOf" in alt:
            result = conform(value, alt)
        elif not isinstance(t, str) or t not in _FROM_TEXT:
            result = value
        elif _IS[t](value):
            result = int(value) if t == "integer" else value
        elif isinstance(value, str) and t != "string":
            result = _FROM_TEXT[t](value)
        else:
            result = _FAIL
        if result is not _FAIL:
            return result
    return _FAIL


def _integer(text: str) -> Any:
    value = _number(text)
    if isinstance(value, float):
        return _FAIL  # 2.5 is no integer; an integral 3.0 has already become 3
    return value


def _number(text: str) -> Any:
    value = parse_number(text.strip())
    return _FAIL if value is None else value


_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def parse_number(s: str) -> int | float | None:
    """A JSON-style number (int when integral), or None; no NaN, Infinity or Python's 1_000."""
    if not _NUMBER.fullmatch(s):
        return None
    if s.lstrip("+-").isdigit():
        return int(s)
    value = float(s)
    if not math.isfinite(value):
        return None
    return int(value) if value.is_integer() else value


def _boolean(text: str) -> Any:
    s = text.strip().lower()
    return True if s == "true" else False if s == "false" else _FAIL


def _null(text: str) -> Any:
    return None if text.strip() in ("null", "None") else _FAIL


def _json_of(kind: type):
    def parse(text: str) -> Any:
        try:
            value = json.loads(text)
        except ValueError:
            return _FAIL
        return value if isinstance(value, kind) else _FAIL

    return parse


_FROM_TEXT = {
    "string": lambda text: text,
    "integer": _integer,
    "number": _number,
    "boolean": _boolean,
    "null": _null,
    "object": _json_of(dict),
    "array": _json_of(list),
}

_IS = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool))
    or (isinstance(v, float) and v.is_integer()),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
}
