"""Which of a prompt's tokens llama.cpp already holds, so that an agent's next turn prefills only
what is new.

An agent resends its whole conversation every turn: the next prompt starts with what the context
holds after the last request (its prompt and most of its answer), so the KV cache is cut back to
the longest common prefix and only the rest is evaluated. When the requests of several
conversations interleave on one server, each would throw the other's cache away; so before a prompt
of another conversation overwrites it, the part the previous conversation's next request will start
with (its `keep_at`) is copied out of llama.cpp (llama_state_seq_get_data), kept in memory, least
recently used out first, within --prefix-cache-tokens and --prefix-cache-mb, and copied back when
that conversation returns. What the context holds, and each saved state, is reused only by a prompt of
the salt it was made under (DecodeRequest.cache_salt, one per tenant): another tenant's identical prompt
is evaluated from nothing. Used from the decode thread only.
"""

from __future__ import annotations

import ctypes
from collections import OrderedDict

from looptrace.common.sequences import common_prefix

from .context import LlamaContext


class PrefixReuse:
    def __init__(self, context: LlamaContext, max_tokens: int, max_bytes: int) -> None:
        self.context = context
        self.max_tokens, self.max_bytes = max_tokens, max_bytes
        self._saved: OrderedDict[tuple[str | None, tuple[int, ...]], ctypes.Array] = OrderedDict()  # (salt, ids)
        self.tokens = self.bytes = 0
        self._keep = 0  # how much of what the context holds its conversation's next request starts with
        self._salt: str | None = None  # the salt of the prompt the context holds

    def prepare(self, prompt: list[int], keep_at: int | None, salt: str | None = None) -> int:
        """Leaves the KV cache holding the longest prefix of `prompt` it can have under `salt`, and returns
        its length: never the whole prompt, whose last token must be evaluated for its logits."""
        context = self.context
        if self.max_tokens <= 0:  # --prefix-cache-tokens 0: every prompt from nothing
            context.clear()
            return 0
        held = common_prefix(context.ids, prompt) if salt == self._salt else 0
        best = self._best(prompt, salt)
        if self._keep > held:  # another conversation's prompt: keep the one held now for its return
            self._stash()
        if best is not None and len(best) > held:
            blob = self._take((salt, best))
            held = len(best) if context.restore(list(best), blob) else 0
        held = min(held, len(prompt) - 1)
        if not context.cut(held):  # a recurrent model's state: all or nothing
            context.clear()
            held = 0
        self._keep = min(keep_at or len(prompt), len(prompt))
        self._salt = salt
        return held

    def _best(self, prompt: list[int], salt: str | None) -> tuple[int, ...] | None:
        """The longest prefix of `prompt` saved under `salt`."""
        best = None
        for saved_salt, ids in self._saved:
            if saved_salt == salt and len(ids) <= len(prompt) and (best is None or len(ids) > len(best)) \
                    and ids == tuple(prompt[:len(ids)]):
                best = ids
        return best

    def _take(self, key: tuple[str | None, tuple[int, ...]]) -> ctypes.Array:
        blob = self._saved.pop(key)
        self.tokens -= len(key[1])
        self.bytes -= len(blob)
        return blob

    def _stash(self) -> None:
        """Saves what the context holds up to the point its conversation will come back to."""
        context, keep = self.context, self._keep
        if keep > self.max_tokens or not context.cut(keep):
            return
        key = (self._salt, tuple(context.ids))
        if key in self._saved:
            self._take(key)
        blob = context.save()
        if len(blob) > self.max_bytes:
            return
        while self._saved and (self.tokens + len(key[1]) > self.max_tokens or self.bytes + len(blob) > self.max_bytes):
            self._take(next(iter(self._saved)))
        self._saved[key] = blob
        self.tokens += len(key[1])
        self.bytes += len(blob)

    def stats(self) -> dict:
        return {"prompts": len(self._saved), "tokens": self.tokens, "max_tokens": self.max_tokens,
                "bytes": self.bytes, "max_bytes": self.max_bytes, "held_tokens": len(self.context.ids)}
