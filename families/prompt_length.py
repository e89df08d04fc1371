"""A prompt far past the context, found before rendering it.

Rendering tokenizes the whole conversation, and the tokenizer holds ~100 bytes per token while it
works: a 10 MB prompt raised the server's RSS by 1.3 GB on its way to a 400. Most of that can be
refused first, from the text every template renders in full (what users, systems and tools said),
with one of two lower bounds on its tokens:

- no token is longer than the vocabulary's longest, so bytes ÷ that many bytes (no tokenizing);
- the text tokenized in slices, counting, stopping as soon as the count is past the context.

A bound only ever refuses a prompt that cannot fit; the exact check after rendering stays. The
slices are counted only when the text is over `SLICED_FROM` bytes per token of context: a prompt
that fits rarely averages that many, so one that fits is almost never tokenized twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

SLICE_CHARS = 1 << 16
SLICES_PER_BATCH = 8  # tokenized together (the tokenizer's threads), then the count is looked at
SLICED_FROM = 8  # bytes per token of context
CUT_MARGIN = 16  # tokens a slice's cut may add: the cut falls before a space, or mid-word at worst
ALWAYS_RENDERED = ("user", "system", "developer", "tool")  # templates may drop past assistant thinking


class PromptLength:
    """Lower bounds on a conversation's prompt tokens, with the checkpoint's tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        tok = getattr(tokenizer, "tokenizer", None)  # a processor wraps its tokenizer
        self._tokenizer = tok if hasattr(tok, "get_vocab") else tokenizer
        self._longest = 0

    def beyond(self, messages: list[dict], limit: int, framing: int = 0) -> int:
        """A lower bound on the prompt's tokens when it is sure to pass `limit`; 0 when not sure.
        `framing`: tokens the template adds around the text for sure (prompt_items.py)."""
        if limit <= 0:
            return 0
        if framing > limit:
            return framing
        # Stripped, as templates often trim content: what is left is in the prompt for sure.
        texts = [t.strip() for t in _always_rendered(messages)]
        size = sum(map(_utf8_size, texts))
        room = limit - framing
        if size <= room:  # a token is at least one byte: it cannot be past
            return 0
        bound = size // self.longest_token_bytes()
        if bound > room:
            return framing + bound
        if size <= room * SLICED_FROM:
            return 0
        counted = self._counted(texts, room)
        return framing + counted if counted else 0

    def longest_token_bytes(self) -> int:
        # Read once from the vocabulary. A token's string is at least as long in bytes as the text it
        # stands for (byte-level BPE writes one character per byte, SentencePiece's ▁ is three).
        if not self._longest:
            self._longest = max((len(t.encode("utf-8", "surrogatepass")) for t in self._tokenizer.get_vocab()),
                                default=1)
        return self._longest

    def _counted(self, texts: list[str], limit: int) -> int:
        count = 0
        batch: list[str] = []
        for piece in _slices(texts):
            batch.append(piece)
            if len(batch) == SLICES_PER_BATCH:
                count += self._count(batch) - CUT_MARGIN * len(batch)
                batch = []
                if count > limit:
                    return count
        if batch:
            count += self._count(batch) - CUT_MARGIN * len(batch)
        return count if count > limit else 0

    def _count(self, pieces: list[str]) -> int:
        backend = getattr(self._tokenizer, "backend_tokenizer", None)
        if backend is not None:  # a fast tokenizer: no offsets or strings kept, the slices in parallel
            encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
            return sum(len(e.ids) for e in encode(pieces, add_special_tokens=False))
        return sum(len(self._tokenizer.encode(p, add_special_tokens=False)) for p in pieces)


def _utf8_size(text: str) -> int:
    # Without an encoded copy of a large text when it is ASCII (isascii() is O(1) in CPython).
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _always_rendered(messages: list[dict]) -> Iterator[str]:
    for message in messages:
        if not isinstance(message, dict) or message.get("role") not in ALWAYS_RENDERED:
            continue
        content = message.get("content")
        if isinstance(content, str):
            yield content
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    yield part["text"]


def _slices(texts: list[str]) -> Iterator[str]:
    """Each text in slices of about SLICE_CHARS, cut before a space where one is near the end."""
    for text in texts:
        start = 0
        while start < len(text):
            end = min(start + SLICE_CHARS, len(text))
            if end < len(text):
                space = text.rfind(" ", end - SLICE_CHARS // 4, end)
                end = space if space > start else end
            yield text[start:end]
            start = end
