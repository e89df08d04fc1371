"""Token ids to text, incrementally, and token ids to their vocabulary pieces.

Every backend decodes the same way, here, so their text is identical for identical ids.
"""

from __future__ import annotations

from typing import Any

from tokenizers.decoders import DecodeStream


class Vocabulary:
    """What the per-token path needs from a tokenizer, as plain lookups."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        size = len(tokenizer)
        # A list indexed by id: the piece and special-ness of a token cost one lookup each.
        self.pieces: list[str] = [p if p is not None else "" for p in tokenizer.convert_ids_to_tokens(list(range(size)))]
        self.special: frozenset[int] = frozenset(tokenizer.all_special_ids) | frozenset(
            i for i, t in tokenizer.added_tokens_decoder.items() if t.special
        )
        self._fast = getattr(tokenizer, "backend_tokenizer", None)

    def piece(self, token_id: int) -> str:
        return self.pieces[token_id] if 0 <= token_id < len(self.pieces) else ""

    def detokenizer(self, prompt_tail: list[int] | None = None) -> "Detokenizer":
        if self._fast is not None:
            return StreamDetokenizer(self._fast, prompt_tail)
        return WindowDetokenizer(self.tokenizer, prompt_tail)


class Detokenizer:
    def step(self, token_id: int) -> str:
        raise NotImplementedError

    def flush(self) -> str:
        """At the end of the output: bytes still waiting for the rest of their character, as U+FFFD,
        so the last token's text is never lost."""
        raise NotImplementedError


class StreamDetokenizer(Detokenizer):
    """tokenizers' own incremental decoder: it holds back an incomplete UTF-8 sequence until whole."""

    def __init__(self, tokenizer: Any, prompt_tail: list[int] | None) -> None:
        self._tokenizer = tokenizer
        # Seeding with the prompt's last ids makes the first piece decode in context (a SentencePiece
        # word-start space, say), exactly as it will read in the whole sequence.
        self._stream = DecodeStream(ids=prompt_tail or None, skip_special_tokens=False)
        self._held: list[int] = []  # ids whose text the stream has not given out yet

    def step(self, token_id: int) -> str:
        text = self._stream.step(self._tokenizer, token_id)
        if text is None:
            self._held.append(token_id)
            return ""
        self._held.clear()
        return text

    def flush(self) -> str:
        held, self._held = self._held, []
        return self._tokenizer.decode(held, skip_special_tokens=False) if held else ""


class WindowDetokenizer(Detokenizer):
    """For tokenizers without a Rust backend: decode a short window and diff it.

    Decoding from a few tokens back (not the whole output) keeps each step O(1) while still
    seeing the context a piece needs; text ending in U+FFFD waits for the rest of its character.
    """

    def __init__(self, tokenizer: Any, prompt_tail: list[int] | None) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = list(prompt_tail or [])
        self._prefix = 0
        self._read = len(self._ids)

    def step(self, token_id: int) -> str:
        self._ids.append(token_id)
        decode = self._tokenizer.decode
        before = decode(self._ids[self._prefix : self._read])
        after = decode(self._ids[self._prefix :])
        if after.endswith("\ufffd") or len(after) <= len(before):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return after[len(before) :]

    def flush(self) -> str:
        if self._read == len(self._ids):
            return ""
        before = self._tokenizer.decode(self._ids[self._prefix : self._read])
        after = self._tokenizer.decode(self._ids[self._prefix :])
        self._read = len(self._ids)
        return after[len(before) :]


class AlternativeTexts:
    """A token's text on its own (what a person reads for an alternative), each id decoded once."""

    def __init__(self, vocab: Vocabulary) -> None:
        self.vocab = vocab
        self._known: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._known.get(token_id)
        if text is None:
            text = self._known[token_id] = self.vocab.tokenizer.decode([token_id], skip_special_tokens=False)
        return text

    def add_to(self, tokens: list[dict]) -> None:
        """`top_texts` beside each token's `top_ids`."""
        for token in tokens:
            if "top_ids" in token:
                token["top_texts"] = [self(i) for i in token["top_ids"]]
