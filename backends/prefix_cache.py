"""The model's state after recent prompts, kept so that an agent's next turn prefills only what is new.

An agent resends its whole conversation every turn: the next prompt is the last one, then the model's
answer, the tool's result and a new generation prompt. The cache right after a prompt's prefill is
copied (decoding goes on to change the original) and kept with that prompt's ids and last logits; a
later prompt that starts with those ids prefills only the rest, and one that equals them none.

Only a whole kept prompt is reused, never a shorter common prefix: the state of linear-attention
layers (Qwen3.5's Gated DeltaNet) and of sliding-window layers (Gemma 4) cannot be cut back to an
earlier position. Bounded by the tokens kept, least recently used out first. Used from the decode
thread only.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from typing import NamedTuple

import torch


class Kept(NamedTuple):
    cache: object  # the model's cache object after the prompt
    logits: torch.Tensor  # the prompt's last position


class PrefixCache:
    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self._kept: OrderedDict[tuple[int, ...], Kept] = OrderedDict()
        self._tokens = 0

    def take(self, prompt_ids: list[int]) -> tuple[int, Kept | None]:
        """The longest kept prompt that starts `prompt_ids`, removed (the caller's decoding will change
        it), and its length; (0, None) when there is none."""
        best: tuple[int, ...] | None = None
        for ids in self._kept:
            if len(ids) <= len(prompt_ids) and (best is None or len(ids) > len(best)) \
                    and ids == tuple(prompt_ids[:len(ids)]):
                best = ids
        if best is None:
            return 0, None
        self._tokens -= len(best)
        return len(best), self._kept.pop(best)

    def keep(self, prompt_ids: list[int], cache: object, logits: torch.Tensor) -> bool:
        """Keeps a copy of the state after `prompt_ids`, before decoding changes it; False when the
        prompt alone is longer than the whole bound."""
        if len(prompt_ids) > self.max_tokens:
            return False
        key = tuple(prompt_ids)
        if key in self._kept:
            self._tokens -= len(key)
            del self._kept[key]
        while self._kept and self._tokens + len(key) > self.max_tokens:
            oldest, _ = self._kept.popitem(last=False)
            self._tokens -= len(oldest)
        self._kept[key] = Kept(copy.deepcopy(cache), logits.clone())
        self._tokens += len(key)
        return True

    @property
    def tokens(self) -> int:
        return self._tokens

    def __len__(self) -> int:
        return len(self._kept)
