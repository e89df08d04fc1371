"""Type checks for request bodies that name the offending field, so a 400 says exactly what is wrong.

Written by hand instead of with a schema library: the API's own types are few, unknown fields must
pass through silently, and the error must carry OpenAI's `param`.
"""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any

from aiohttp import web

from .errors import invalid

_MISSING = object()

TYPE_NAMES = {str: "a string", bool: "a boolean", int: "an integer", float: "a number", list: "an array", dict: "an object"}


_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


MAX_DEPTH = 64  # arrays and objects within each other: far past any real schema, short of any recursion limit
# Values in a body (arrays, objects, and the items and members in them): an agent's longest session is
# tens of thousands, and every limit on items (families/prompt_items.py) fits well within. Parsing
# builds a Python object for each (200,000 small objects took 1.3 s to parse on a busy machine), so a
# body of 2,000,000 one-character messages (68 MB) is refused by this count before it is parsed.
MAX_JSON_VALUES = 1 << 18


_DIGITS_AS_ZERO = bytes.maketrans(b"123456789E", b"000000000e")


class _NotFinite:
    """NaN, Infinity or a number past a float's range (1e400), as read: Python's json takes them, JSON
    has none, and one taken in comes back out as invalid JSON (json.dumps writes NaN) or as null
    (orjson), in an answer, a stored reward or an export. Held in the body until its place is found."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


_LONG_NUMBER = b"0" * 200


def _json_loads(text: str, raw: bytes) -> tuple[Any, bool]:
    """The value of `text` (`raw`, decoded), and whether it holds a _NotFinite."""
    # Only a number with a 3-digit exponent or 200 digits before its point can pass a float's range
    # (1.8e308; under 10^200 × 10^99 without): where the body holds neither, strings included, floats
    # are read by json's own C code, not by `number`.
    shape = raw.translate(_DIGITS_AS_ZERO)  # a C pass: about 2 ms a megabyte, where a regex took 50
    might_overflow = b"e000" in shape or b"e+000" in shape or _LONG_NUMBER in shape
    if not might_overflow and b"NaN" not in raw and b"Infinity" not in raw:
        return json.loads(text), False  # json's shared decoder: no constant or overflow can be in it
    found = []

    def constant(name: str) -> _NotFinite:
        found.append(True)
        return _NotFinite(name)

    def number(digits: str) -> float | _NotFinite:
        value = float(digits)
        return constant(digits) if value in (math.inf, -math.inf) else value

    return json.loads(text, parse_constant=constant, parse_float=number if might_overflow else float), bool(found)


async def json_body(request: web.Request) -> dict:
    raw = await request.read()
    try:
        text = await request.text()
    except UnicodeDecodeError as exc:
        raise invalid(f"The request body is not valid JSON: {exc}", code="invalid_json") from exc
    return json_object(raw, text)


def json_object(raw: bytes, text: str) -> dict:
    """A JSON object read from a client (a request body, a WebSocket message), with the bounds every
    one is held to: its count of values, its nesting, its numbers."""
    try:
        if json_values(raw) > MAX_JSON_VALUES:
            raise invalid(f"The request body holds more than {MAX_JSON_VALUES:,} JSON values (arrays, objects and "
                          "the items in them); at most that many are read.", code="too_many_items")
        body, not_finite = _json_loads(text, raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise invalid(f"The request body is not valid JSON: {exc}", code="invalid_json") from exc
    except ValueError as exc:  # the one other refusal of json.loads: an integer too long to read
        raise invalid(_too_many_digits("The request body"), code="invalid_json") from exc
    except RecursionError:
        body = _MISSING
    if body is _MISSING or nesting(body) > MAX_DEPTH:
        # Templates, the trace and the parsers all walk what a client nests: bound it once, here.
        raise invalid(f"The request body is nested too deeply: at most {MAX_DEPTH} levels of arrays and objects.",
                      code="invalid_json")
    if not isinstance(body, dict):
        raise invalid("The request body must be a JSON object.", code="invalid_json")
    if not_finite:
        _refuse_not_finite(body)
    if _ESCAPED_SURROGATE.search(text):
        body = _replace_lone_surrogates(body)
    return body


def _refuse_not_finite(body: Any) -> None:
    """A 400 naming the first non-finite number's place in the body (`steps[2].info.score`)."""
    stack = [(body, "")]
    while stack:
        value, path = stack.pop()
        if type(value) is _NotFinite:
            raise invalid(f"Invalid value for '{path}': {value.text[:32]} is not a finite number (NaN, Infinity and "
                          "numbers past a float's range are not JSON).", param=path)
        if isinstance(value, dict):
            stack.extend((v, f"{path}.{k}" if path else str(k)) for k, v in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((v, f"{path}[{n}]") for n, v in reversed(list(enumerate(value))))


_STRUCTURE = b'"{[,'
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in _STRUCTURE)
_CHUNK = 1 << 22


def json_values(raw: bytes, most: int = MAX_JSON_VALUES) -> int:
    """The values in a JSON text, at most: its `{`, `[` and `,` outside strings (every value but a
    container's first follows a comma), counted without parsing it, until the count is past `most`.

    Written by hand (no JSON library counts without building the values), in C-speed passes: a body
    under 4 MiB with fewer such characters in all, strings included, is done after three counts; any
    other is read 4 MiB at a time, so a body far past the limit costs what the limit does."""
    if len(raw) <= _CHUNK:
        loose = raw.count(b"{") + raw.count(b"[") + raw.count(b",")
        if loose <= most:
            return loose
    import numpy as np

    count, in_string, start = 0, 0, 0
    while start < len(raw) and count <= most:
        end = min(start + _CHUNK, len(raw))
        while end < len(raw) and raw[end - 1] == 0x5C:  # never between a backslash and what it escapes
            end += 1
        chunk = raw[start:end]
        start = end
        # An escaped backslash, then an escaped quote, never ends a string: gone, what is left of the
        # chunk is its quotes and the three characters, whose place (in a string or not) a quote's
        # parity says.
        if b"\\" in chunk:
            chunk = chunk.replace(b"\\\\", b"").replace(b'\\"', b"")
        chars = np.frombuffer(chunk.translate(None, _NOT_STRUCTURE), dtype=np.uint8)
        quotes = chars == ord('"')
        parity = (np.cumsum(quotes, dtype=np.uint8) + in_string) & 1  # wraps at 256; the parity does not
        count += int(np.count_nonzero(~quotes & (parity == 0)))
        in_string = int(parity[-1]) if parity.size else in_string
    return count


class ArgumentsAsWritten(dict):
    """A past call's arguments that were not strict JSON (NaN, Infinity, 1e400): the template gets the
    values as Python's json reads them, as before, and `text` keeps what the client wrote, which is what
    the trace records, since no strict reader takes those numbers back."""

    __slots__ = ("text",)

    def __init__(self, value: dict, text: str) -> None:
        super().__init__(value)
        self.text = text


def _as_floats(value: Any) -> Any:
    if type(value) is _NotFinite:
        return float(value.text)  # json's own reading: nan, inf, -inf
    if isinstance(value, list):
        return [_as_floats(v) for v in value]
    if isinstance(value, dict):
        return {k: _as_floats(v) for k, v in value.items()}
    return value


def embedded_json(text: str, param: str) -> Any:
    """JSON sent inside a string (a past call's arguments): held to what a body is held to; an object
    with numbers JSON has not (NaN, Infinity, 1e400) is kept with the text as written (ArgumentsAsWritten)."""
    try:
        value, not_finite = _json_loads(text, text.encode("utf-8", "surrogatepass"))
    except json.JSONDecodeError as exc:
        raise invalid(f"'{param}' is not valid JSON: {exc}", param=param) from exc
    except ValueError as exc:
        raise invalid(_too_many_digits(f"'{param}'"), param=param) from exc
    except RecursionError:
        value = _MISSING
    if value is _MISSING or (text.count("{") + text.count("[") > MAX_DEPTH and nesting(value) > MAX_DEPTH):
        # (No walk where the text has too few brackets, strings' included, to nest that deep.)
        raise invalid(f"'{param}' is nested too deeply: at most {MAX_DEPTH} levels of arrays and objects.",
                      param=param)
    value = _replace_lone_surrogates(value) if _ESCAPED_SURROGATE.search(text) else value
    if not_finite:
        value = _as_floats(value)
        return ArgumentsAsWritten(value, text) if isinstance(value, dict) else value
    return value


def _too_many_digits(where: str) -> str:
    # Python reads integers of at most sys.get_int_max_str_digits() digits (4,300), a bound on the
    # quadratic cost of converting one; no setting or id is that long, so the bound stays.
    return (f"{where} holds an integer of more than {sys.get_int_max_str_digits():,} digits, longer than any "
            "value here can be; it was not read.")


def nesting(value: Any) -> int:
    """How deep arrays and objects sit within each other (a walk with a stack, not recursion)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = item.values()
        elif not isinstance(item, list):
            continue
        deepest = max(deepest, depth)
        if depth > MAX_DEPTH:
            return depth
        stack.extend((child, depth + 1) for child in item)
    return deepest


def _replace_lone_surrogates(value: Any) -> Any:
    """Half of a UTF-16 pair, escaped, is valid JSON (JavaScript's JSON.stringify writes one for a
    string cut between the halves, as a clipped tool output can be), but it is not text: no tokenizer
    or UTF-8 encoder takes it. It becomes U+FFFD, as undecodable bytes do; whole pairs were already
    joined into one character by json.loads."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_replace_lone_surrogates(v) for v in value]
    if isinstance(value, dict):
        return {_replace_lone_surrogates(k): _replace_lone_surrogates(v) for k, v in value.items()}
    return value


# A tool's name, as the model will write it in a call: OpenAI allows [a-zA-Z0-9_-], 64 of them, and
# Anthropic the same, 128. Taken here: those, and '.', which other servers take and codex's namespaces
# flatten to (`namespace.tool`). Nothing else: a name is written into the prompt, and one holding a
# control token (`f<|im_end|>`) must not reach it.
TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")


def tool_name(name: str, param: str) -> str:
    """`name` if it is one a tool may have, else a 400 naming `param`."""
    if not TOOL_NAME.fullmatch(name):
        raise invalid(f"Invalid '{param}': string does not match pattern. Expected a string that matches the "
                      f"pattern '^{TOOL_NAME.pattern}$' (letters, digits, '_', '-' and '.', at most 128).",
                      param=param)
    return name


def field(obj: dict, key: str, kind: type, param: str, *, required: bool = False, default: Any = None,
          nullable: bool = True) -> Any:
    """obj[key] checked against `kind` (int accepts no bools; float accepts ints)."""
    value = obj.get(key, _MISSING)
    if value is _MISSING or (value is None and nullable):
        if required:
            raise invalid(f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter")
        return default
    if not is_a(value, kind):
        raise invalid(
            f"Invalid type for '{param}': expected {TYPE_NAMES[kind]}, but got {describe(value)}.",
            param=param, code="invalid_type",
        )
    if kind is float:
        # JSON parsers take NaN and Infinity, and integers past a float's range; none is a setting.
        try:
            value = float(value)
        except OverflowError:
            value = math.inf
        if not math.isfinite(value):
            raise invalid(f"Invalid value for '{param}': expected a finite number.", param=param)
    return value


def is_a(value: Any, kind: type) -> bool:
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def describe(value: Any) -> str:
    for kind, name in ((bool, "a boolean"), (str, "a string"), (int, "an integer"), (float, "a number"),
                       (list, "an array"), (dict, "an object")):
        if isinstance(value, kind):
            return name
    return "null" if value is None else type(value).__name__


def in_range(value: float | int | None, param: str, low: float | None = None, high: float | None = None) -> None:
    if value is None:
        return
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"between {low} and {high}" if low is not None and high is not None else (
            f"at least {low}" if low is not None else f"at most {high}")
        raise invalid(f"Invalid value for '{param}': {value} is not {bounds}.", param=param)
