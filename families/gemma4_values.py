"""Gemma 4's argument syntax: `{key:<|"|>text<|"|>,n:42,ok:true,obj:{…},arr:[…]}`.

Keys are bare, strings are delimited only by the `<|"|>` token (so `}`, `,` and `:` inside one are
text), numbers, true, false and null are written as in JSON. A bare word (without `:`), a JSON
string or a single-quoted one (`['a.py', 'b.py']`, as the model sometimes writes lists) where a
value belongs is taken as a string, since that is what the model meant. Anything else is a syntax
error.
"""

from __future__ import annotations

import re
from json.decoder import scanstring
from typing import Any

from .tool_schema import parse_number

QUOTE = '<|"|>'
_MAX_DEPTH = 64  # deeper than any real argument; keeps malformed output from exhausting the stack


def parse_arguments(text: str) -> dict:
    """Parse a call's `{…}` body into a dict; raises ValueError when it is not well formed."""
    reader = _Reader(text)
    value = reader.value(0)
    reader.skip_ws()
    if reader.pos != len(text) or not isinstance(value, dict):
        raise ValueError("not one Gemma 4 object")
    return value


class _Reader:
    __slots__ = ("text", "pos")

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def skip_ws(self) -> None:
        text, pos = self.text, self.pos
        while pos < len(text) and text[pos].isspace():
            pos += 1
        self.pos = pos

    def value(self, depth: int) -> Any:
        if depth > _MAX_DEPTH:
            raise ValueError("nested too deeply")
        self.skip_ws()
        text, pos = self.text, self.pos
        if text.startswith(QUOTE, pos):
            return self.string()
        if pos >= len(text):
            raise ValueError("value missing")
        if text[pos] == "{":
            return self.container(depth, "}")
        if text[pos] == "[":
            return self.container(depth, "]")
        if text[pos] == '"':  # a JSON string where a Gemma one belongs
            value, self.pos = scanstring(text, pos + 1)
            return value
        if text[pos] == "'":  # a single-quoted one
            end = single_quoted_end(text, pos)
            if end == -1:
                raise ValueError("unterminated string")
            self.pos = end
            return unescape_single_quoted(text[pos + 1 : end - 1])
        return self.literal()

    def string(self) -> str:
        start = self.pos + len(QUOTE)
        end = self.text.find(QUOTE, start)
        if end == -1:
            raise ValueError("unterminated string")
        self.pos = end + len(QUOTE)
        return self.text[start:end]

    def container(self, depth: int, close: str) -> dict | list:
        result: dict | list = {} if close == "}" else []
        self.pos += 1
        while True:
            self.skip_ws()
            if self.text.startswith(close, self.pos):
                self.pos += 1
                return result
            if close == "}":
                key = self.key()
                result[key] = self.value(depth + 1)
            else:
                result.append(self.value(depth + 1))
            self.skip_ws()
            if self.text.startswith(",", self.pos):
                self.pos += 1  # a trailing comma before the close is tolerated
            elif not self.text.startswith(close, self.pos):
                raise ValueError(f"expected ',' or {close!r} at {self.pos}")

    def key(self) -> str:
        text = self.text
        if text.startswith(QUOTE, self.pos):
            key = self.string()
        elif text.startswith('"', self.pos):
            end = text.find('"', self.pos + 1)
            if end == -1:
                raise ValueError("unterminated key")
            key, self.pos = text[self.pos + 1 : end], end + 1
        else:
            end = text.find(":", self.pos)
            if end == -1:
                raise ValueError("key without ':'")
            key, self.pos = text[self.pos : end].strip(), end
        self.skip_ws()
        if not key or any(c in key for c in "{}[],") or not text.startswith(":", self.pos):
            raise ValueError(f"bad key at {self.pos}")
        self.pos += 1
        return key

    def literal(self) -> Any:
        text, start = self.text, self.pos
        end = start
        while end < len(text) and text[end] not in ",}]" and not text.startswith(QUOTE, end):
            end += 1
        word = text[start:end].strip()
        self.pos = end
        if not word or word[0] in "{[:":
            raise ValueError(f"value missing at {start}")
        if word in ("true", "false"):
            return word == "true"
        if word == "null":
            return None
        number = parse_number(word)
        if number is not None:
            return number
        if ":" in word:  # `a:1 b:2`: a missing comma, not a word
            raise ValueError(f"not a value at {start}")
        return word


def single_quoted_end(text: str, start: int) -> int:
    """Just past the `'` closing the single-quoted string opened at text[start], or -1."""
    i = start + 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
        elif text[i] == "'":
            return i + 1
        else:
            i += 1
    return -1


# Written by hand rather than ast.literal_eval: the model's strings are not always valid Python
# (`'C:\\x'`, a raw newline), and a bad escape is kept as written, never an error.
_ESCAPE = re.compile(r"\\(.)", re.S)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"'}


def unescape_single_quoted(body: str) -> str:
    return _ESCAPE.sub(lambda m: _ESCAPES.get(m.group(1), m.group(0)), body)
