"""JSON text for everything looptrace sends: orjson, with json where orjson refuses.

orjson is several times faster than json, and JSON is most of the per-token work of relaying a
stream (a `json.dumps` of every new piece of text). It refuses what json still writes: a string
with a lone surrogate (a client may send `\\ud800`), an integer past 64 bits, a key that is not a
string. Those rare objects go through json, which escapes the surrogate and writes the rest.
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
