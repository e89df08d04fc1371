"""The model's state after recent prompts, kept so that an agent's next turn prefills only what is new.

An agent resends its whole conversation every turn: the next prompt is the last one, then the model's
answer, the tool's result and a new generation prompt. The cache right after a prompt's prefill is
copied (decoding goes on to change the original) and kept with that prompt's ids and last logits; a
later prompt that starts with those ids prefills only the rest, and one that equals them none.

Only a whole kept prompt is reused, never a shorter common prefix: the state of linear-attention
layers (Qwen3.5's Gated DeltaNet) and of sliding-window layers (Gemma 4) cannot be cut back to an
earlier position. A kept prompt is found only by a request of the same salt (DecodeRequest.cache_salt,
one per tenant): the same ids of another tenant are another prompt.

Bounded by the tokens kept and by bytes, least recently used out first: each entry
also holds what does not grow with its prompt (the last logits, a vocabulary's worth of floats;
linear-attention state), so short prompts once filled gigabytes within the token bound. Used from
the decode thread only.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from typing import NamedTuple

import torch

MAX_BYTES = 2 * 1024**3


class Kept(NamedTuple):
    cache: object  # the model's cache object after the prompt
    logits: torch.Tensor  # the prompt's last position
    nbytes: int  # the tensors both hold
    media: tuple = ()  # (offset, length, sha256) of each attached item the prompt holds
    state: dict | None = None  # what the model keeps beside the cache (Qwen3.5's multimodal rope offset)


def tensor_bytes(obj: object) -> int:
    """The bytes of every tensor reachable from a cache object (its layers, lists and attributes)."""
    total, seen, stack = 0, set(), [obj]
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, torch.Tensor):
            total += item.nbytes
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif hasattr(item, "__dict__"):
            stack.extend(vars(item).values())
    return total


class PrefixCache:
    def __init__(self, max_tokens: int, max_bytes: int = MAX_BYTES) -> None:
        self.max_tokens, self.max_bytes = max_tokens, max_bytes
        self._kept: OrderedDict[tuple[str | None, tuple[int, ...]], Kept] = OrderedDict()  # by (salt, ids)
        self._tokens = 0
        self._bytes = 0

    def take(self, prompt_ids: list[int], media: tuple = (), salt: str | None = None) -> tuple[int, Kept | None]:
        """The longest kept prompt that starts `prompt_ids`, removed (the caller's decoding will change
        it), and its length; (0, None) when there is none.

        With `media` (offset, length, sha256 of each attached item): the same ids with another image
        in the image tokens are not the same prompt, so a kept one must hold the same items, and all
        of them (what is prefilled after it is text: an item's pixels go in with all of its tokens).
        `salt`: only what was kept under it is found."""
        best: tuple[int, ...] | None = None
        end = max((offset + length for offset, length, _ in media), default=0)
        for (kept_salt, ids), kept in self._kept.items():
            if kept_salt == salt and len(ids) <= len(prompt_ids) and (best is None or len(ids) > len(best)) \
                    and len(ids) >= end and kept.media == media and ids == tuple(prompt_ids[:len(ids)]):
                best = ids
        if best is None:
            return 0, None
        kept = self._kept.pop((salt, best))
        self._tokens -= len(best)
        self._bytes -= kept.nbytes
        return len(best), kept

    def keep(self, prompt_ids: list[int], cache: object, logits: torch.Tensor, media: tuple = (),
             state: dict | None = None, salt: str | None = None) -> bool:
        """Keeps a copy of the state after `prompt_ids`, before decoding changes it; False when the
        prompt alone is longer than the whole bound. `media`, `state`: as in Kept; `salt`: as in take."""
        if len(prompt_ids) > self.max_tokens:
            return False
        key = (salt, tuple(prompt_ids))
        nbytes = tensor_bytes(cache) + logits.nbytes + tensor_bytes(state)
        if nbytes > self.max_bytes:
            return False
        if key in self._kept:
            self._tokens -= len(prompt_ids)
            self._bytes -= self._kept.pop(key).nbytes
        while self._kept and (self._tokens + len(prompt_ids) > self.max_tokens
                              or self._bytes + nbytes > self.max_bytes):
            (_, oldest), gone = self._kept.popitem(last=False)
            self._tokens -= len(oldest)
            self._bytes -= gone.nbytes
        self._kept[key] = Kept(copy.deepcopy(cache), logits.clone(), nbytes, media, copy.deepcopy(state))
        self._tokens += len(prompt_ids)
        self._bytes += nbytes
        return True

    @property
    def tokens(self) -> int:
        return self._tokens

    @property
    def bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._kept)
