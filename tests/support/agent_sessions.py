"""Agent sessions as a harness sends them, turn by turn: each turn the whole conversation again, grown by
the model's last answer (a tool call, or text; reasoning now and then) and what came back (a tool's
result, or the user). Text is drawn from code, prose, accented, decomposed, CJK and emoji pieces and
`hostile` strings (control tokens a client might type), so that every kind of text meets every
place a template puts it. Seeded: the same session every run."""

from __future__ import annotations

import random
from collections.abc import Iterator

READ_FILE = {"type": "function", "function": {
    "name": "read_file", "description": "Read a file of the repository.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "lines": {"type": "integer"}},
                   "required": ["path"]}}}
PIECES = ("def", "return x", "café", "naïve", "e\u0301", "\u0301", "日本語", "模型", "🙂", "🎉x", "{", "}", '"',
          "\\n", "\n", "  ", "\t", "<b>", "</b>", "résumé", "x" * 40, "0.5", "-", "#")


def text(rng: random.Random, words: int, hostile: list[str]) -> str:
    pool = (*PIECES, *hostile)
    return "".join(rng.choice(pool) + rng.choice(("", " ", "")) for _ in range(words))


def turns(seed: int, count: int, hostile: list[str], reasoning: bool = True) -> Iterator[list[dict]]:
    """The messages of each of `count` turns of one session."""
    rng = random.Random(seed)
    messages = [{"role": "system", "content": "You are a coding agent. " + text(rng, 30, hostile)},
                {"role": "user", "content": text(rng, 20, hostile)}]
    for turn in range(count):
        yield list(messages)
        answer: dict = {"role": "assistant", "content": ""}
        if reasoning and rng.random() < 0.5:
            answer["reasoning_content"] = text(rng, 15, hostile)
        if rng.random() < 0.7:
            call_id = f"call_{seed}_{turn}"
            answer["tool_calls"] = [{"id": call_id, "type": "function", "function": {
                "name": "read_file", "arguments": {"path": text(rng, 3, hostile), "lines": rng.randint(1, 500)}}}]
            messages += [answer, {"role": "tool", "tool_call_id": call_id,
                                  "content": text(rng, rng.randint(5, 200), hostile)}]
        else:
            answer["content"] = text(rng, 20, hostile)
            messages += [answer, {"role": "user", "content": text(rng, 10, hostile)}]
