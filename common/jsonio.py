"""JSON for the per-token paths (the vLLM stream, SSE frames, the trace store's writer): orjson,
with json where orjson refuses.

orjson is several times faster than json, and JSON is most of the per-token work of relaying a
stream. It refuses what json still handles: writing a string with a lone surrogate (a client may
send `\\ud800`), an integer past 64 bits or a key that is not a string, and reading NaN or Infinity
(which Python's json writes, and a vLLM server built on it may send). Those rare cases go through json.

It lives here, the lowest package of every user (the API adapters, the vLLM backend, the trace store).
"""

from __future__ import annotations

import json

import orjson


def dumps(obj: object) -> str:
    """Compact JSON; non-ASCII text as UTF-8, not escaped."""
    try:
        return orjson.dumps(obj).decode()
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return json.dumps(obj, separators=(",", ":"))


def loads(text: str | bytes) -> object:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)
