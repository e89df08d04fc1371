"""What a conversation's turn was asked and what its model answered, as digests: what token continuity
(continuity.py) compares the next turn's request with, to know that it continues this turn.

- each message the turn was asked with: the next turn's history starts with the same ones, or it
  was edited (compacted, rewritten);
- the tools and template settings it was rendered with (`settings`): change them and the template
  renders the turns before the answer otherwise (a tools block comes or goes, thinking changes what
  the system turn and the generation prompt hold);
- the model's answer as its parser read it (`answer`): the text, spacing aside (a client may trim it
  or rewrap it), the reasoning, and each call's name and arguments as JSON values. An assistant message
  that says anything else (an empty one, a part of the answer, a call the model never made or with
  other arguments) is not the model's answer.

Digests rather than the text: they are kept for every conversation, in the shared store where there is
one (memory.py), 8 bytes each, the same in every process (BLAKE2b; str's hash differs between them).
"""

from __future__ import annotations

import hashlib
import json
from array import array
from typing import NamedTuple

import orjson

from looptrace.common.jsonio import dumps, loads


class Asked(NamedTuple):
    """What a turn was asked: its messages, a digest each, and its tools and template settings."""

    messages: list[int]
    settings: int


class TurnDigests(NamedTuple):
    """What a turn was asked, and what its model answered: (text, reasoning, calls), a digest each."""

    messages: list[int]
    settings: int
    answer: tuple[int, int, int]


def digest(text: str) -> int:
    """8 bytes of BLAKE2b, as a signed 64-bit int (what the store's packed arrays hold)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(),
                          "little", signed=True)


def asked(messages: list[dict], tools: list[dict] | None, enable_thinking: bool | None) -> Asked | None:
    """The request's messages and settings as digests (the tools it renders: none when tool_choice is
    "none"); None when a message cannot be written as JSON (then the turn is not continued)."""
    try:
        return Asked([digest(dumps(m)) for m in messages], digest(_canonical([tools or None, enable_thinking])))
    except (TypeError, ValueError):
        return None


def answered(question: Asked, text: str, reasoning: str, calls: list[tuple[str, str]]) -> TurnDigests:
    """The turn's digests once its model answered: its text and reasoning as the client received them,
    and its calls (name, arguments as the parser wrote them: a JSON object)."""
    return TurnDigests(question.messages, question.settings,
                       (digest(_words(text)), digest(_words(reasoning)),
                        digest(_canonical([[name, _value(arguments)] for name, arguments in calls]))))


def is_the_answer(message: dict, answer: tuple[int, int, int]) -> bool:
    """Whether an assistant message a client sent back is the model's answer: the same text (spacing
    aside), the same calls in the same order with the same arguments, and the same reasoning unless
    the client left it out (most do; the template may drop it anyway)."""
    text, reasoning, calls = answer
    said = [[(c.get("function") or {}).get("name"), (c.get("function") or {}).get("arguments")]
            for c in message.get("tool_calls") or () if isinstance(c, dict)]
    thought = message.get("reasoning_content")
    try:
        same_calls = digest(_canonical(said)) == calls
    except (TypeError, ValueError):
        return False
    return (same_calls and digest(_words(_text(message.get("content")))) == text
            and (not thought or not isinstance(thought, str) or digest(_words(thought)) == reasoning))


def pack(digests: TurnDigests) -> bytes:
    return array("q", [digests.settings, *digests.answer, *digests.messages]).tobytes()


def unpack(data: bytes | None) -> TurnDigests | None:
    if not data:
        return None
    values = array("q", bytes(data)).tolist()
    return TurnDigests(values[4:], values[0], (values[1], values[2], values[3]))


def _words(text: str) -> str:
    return " ".join(text.split())


def _text(content) -> str:
    """A message's text: a string, or its text parts joined (parts of another kind make it not the answer)."""
    if isinstance(content, list):
        if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
            return "\0not text"
        return "".join(str(p.get("text", "")) for p in content)
    return content if isinstance(content, str) else ""


def _value(arguments: str):
    try:
        return loads(arguments)
    except ValueError:
        return arguments  # what the parser could not read as JSON is compared as it was written


def _canonical(value) -> str:
    """JSON with its keys sorted: the same value written in any order, or re-serialized by a client,
    gives the same text."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:  # what orjson refuses (an integer past 64 bits, a lone surrogate)
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
