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
