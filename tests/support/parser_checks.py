"""Feeding a family parser its output split every way, and what the deltas must be.

Every output is fed whole, one character at a time, split in two at every point, in three at every
pair of points (near each other for long strings), and in token-like pieces; the deltas, merged
where consecutive text of one kind was split, must be exactly the expected ones every time, and no
delta may ever show Gemma's `<|"|>` token. Shared by the family conformance suite and the
family-specific parser tests.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

_ID = re.compile(r"call_[0-9a-f]{32}")
_TOKENISH = re.compile(r'<\|"\|>|</?[\w|]+\|?>|<\|?\w+\|?>|<\w+=|\w+|\s+|.', re.S)
FULL_THREE_WAY = 100  # longer strings get three-way splits with the two cuts near each other
WINDOW = 10

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather forecast for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city", "days"],
        },
    },
}
WRITE = {
    "type": "function",
    "function": {
        "name": "write_file",
        "description": "Write a file.",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "content": {"type": "string"},
                "mode": {"type": ["integer", "null"]},
                "force": {"type": "boolean"},
                "ratio": {"type": "number"},
                "opts": {"type": "object"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "note": {"anyOf": [{"type": "null"}, {"type": "string"}]},
                "label": {"type": ["string", "null"]},
            },
            "required": ["path", "content"],
        },
    },
}
TOOLS = [WEATHER, WRITE]


def call(index: int, name: str, arguments: dict, raw: str, outcome: str = "valid") -> dict:
    return {"type": "tool_call", "index": index, "id": "ID", "name": name,
            "arguments": json.dumps(arguments, ensure_ascii=False), "raw": raw, "outcome": outcome}


def text(s: str) -> dict:
    return {"type": "text", "text": s}


def thinking(s: str) -> dict:
    return {"type": "thinking", "text": s}


def unparsed(raw: str, shown: str | None = None, then: str = "") -> list[dict]:
    """An unparsed call, then its markup as text (merged with the text that follows it)."""
    return [{"type": "tool_call_unparsed", "raw": raw}, text((raw if shown is None else shown) + then)]


def splits(s: str) -> Iterator[list[str]]:
    n = len(s)
    yield [s]
    yield list(s)
    yield _TOKENISH.findall(s)
    for i in range(1, n):
        yield [s[:i], s[i:]]
    for i in range(1, n):
        for j in range(i + 1, n if n <= FULL_THREE_WAY else min(n, i + WINDOW)):
            yield [s[:i], s[i:j], s[j:]]


def run(parser: Any, pieces: list[str]) -> list[dict]:
    deltas = []
    for piece in pieces:
        deltas += parser.feed(piece)
    deltas += parser.finish()
    return deltas


def normalize(deltas: list[dict]) -> list[dict]:
    """Check what must hold for every delta, then merge split text so splits compare equal."""
    merged: list[dict] = []
    for i, d in enumerate(deltas):
        d = dict(d)
        if d["type"] in ("text", "thinking"):
            assert d["text"], "empty text delta"
        for key in ("text", "arguments"):  # Gemma's string token is never shown to a client
            assert '<|"|>' not in d.get(key, ""), d
        if d["type"] == "tool_call":
            assert _ID.fullmatch(d["id"]), d["id"]
            json.loads(d["arguments"])
            d["id"] = "ID"
        if d["type"] == "tool_call_unparsed":  # the raw markup follows, in its channel's words: never dropped
            assert deltas[i + 1]["type"] in ("text", "thinking")
        if merged and d["type"] in ("text", "thinking") and merged[-1]["type"] == d["type"]:
            merged[-1] = {**merged[-1], "text": merged[-1]["text"] + d["text"]}
        else:
            merged.append(d)
    return merged


def check(make: Callable[[], Any], s: str, expected: list[dict]) -> None:
    """All splits of `s` give exactly `expected`; `make()` returns a fresh parser."""
    assert normalize(run(make(), [s])) == expected
    for pieces in splits(s):
        got = normalize(run(make(), pieces))
        assert got == expected, pieces


def token_pieces(tok: Any, s: str) -> list[str]:
    """`s` as the generation layer hands it to a parser: decoded token by token and diffed (a
    character cut between byte tokens waits for its last byte)."""
    ids = tok(s, add_special_tokens=False)["input_ids"]
    pieces, done = [], ""
    for k in range(1, len(ids) + 1):
        now = tok.decode(ids[:k], skip_special_tokens=False)
        if now.endswith("\ufffd"):
            continue
        pieces.append(now[len(done):])
        done = now
    assert done == s
    return pieces
