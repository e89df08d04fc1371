"""JSON for the per-token paths (the vLLM stream, SSE frames, the trace store's writer): orjson,
with json where orjson refuses.

orjson is several times faster than json, and JSON is most of the per-token work of relaying a
stream. It refuses what json still handles: writing a string with a lone surrogate (a client may
send `\\ud800`), an integer past 64 bits or a key that is not a string, and reading NaN or Infinity
(which Python's json writes, and a vLLM server built on it may send). Those rare cases go through json.
orjson also reads an integer past 64 bits as a float, silently (a tool call's 30-digit id would come
back rounded): text with an integer of 19 digits or more is read by json, which keeps it whole.

It lives here, the lowest package of every user (the API adapters, the vLLM backend, the trace store).
"""

from __future__ import annotations

import json
import math
import re

import orjson

# An integer of 19 digits or more (19 may pass 64 bits: -9223372036854775809; 18 never do), not a float's
# digits (a logprob such as -0.0012345678901234567 stays on orjson's path).
_LONG_DIGITS = re.compile(r"(?<![\d.])\d{19,}(?![\d.eE])")
_LONG_DIGITS_BYTES = re.compile(rb"(?<![\d.])\d{19,}(?![\d.eE])")


def dumps(obj: object) -> str:
    """Compact JSON; non-ASCII text as UTF-8, not escaped."""
    try:
        return orjson.dumps(obj).decode()
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return json.dumps(obj, separators=(",", ":"))


def loads(text: str | bytes) -> object:
    long_digits = _LONG_DIGITS if isinstance(text, str) else _LONG_DIGITS_BYTES
    if long_digits.search(text) is not None:
        return json.loads(text)
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def _not_json(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(digits: str) -> float:
    value = float(digits)
    if value in (math.inf, -math.inf):
        raise ValueError(f"{digits[:32]} is past a float's range")
    return value


def loads_strict(text: str) -> object:
    """JSON a client wrote inside a string (a past call's arguments), read as strict parsers read it: NaN,
    Infinity and a number past a float's range (1e400) are a ValueError, where json takes them and writes
    them back out as what no strict reader (JSON.parse, orjson) accepts; long integers stay whole."""
    if _LONG_DIGITS.search(text) is None:
        try:
            return orjson.loads(text)  # refuses NaN, Infinity and 1e400 itself
        except orjson.JSONDecodeError:
            pass  # a lone surrogate's escape, which json reads: decided below
    return json.loads(text, parse_constant=_not_json, parse_float=_finite_float)


def finite(value: object) -> object:
    """`value` with each NaN or infinite float as None (null), as orjson writes them: for a writer that
    must give strict JSON whatever reached it (an export line). A copy only where one is found."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def dumps_line(record: object) -> str:
    """One line of strict JSON, in ASCII (a lone surrogate a model wrote stays writable as its escape):
    a non-finite number becomes null rather than the NaN that json would write."""
    try:
        return json.dumps(record, allow_nan=False)
    except ValueError:
        return json.dumps(finite(record), allow_nan=False)
