"""Speculative decoding for the local backend: drafts proposed cheaply, checked by the model in one
forward pass, the cache cut back to what was accepted. (The llama.cpp backend drafts with the same
proposers and accepts with `judge` too, cutting llama.cpp's KV cache itself.)

`--speculative-config` is shaped as vLLM's flag (config.py). Four ways to draft:
  ngram        prompt lookup (PromptLookup): the tokens that followed the latest earlier occurrence
               of the output's last n tokens (n from prompt_lookup_max down to prompt_lookup_min), in
               the prompt or the output so far. Any model; agents mostly write back what they read.
  suffix       suffix decoding (suffix.py): the continuation that most often followed the longest
               matching suffix, in this request and the ones before it, as long as it is likely.
  draft_model  a smaller checkpoint with the same tokenizer drafts greedily (or by sampling, when the
               request samples), with a cache of its own (DraftModel).
  mtp          the checkpoint's own multi-token prediction: Qwen3.5's MTP layer (mtp_qwen3_5.py), a
               Gemma 4 assistant reading the model's keys and values (mtp_gemma4.py); both are fed
               the model's last hidden state, taken from its forward passes (taps.py).
The target verifies with sampling.verified_token: greedy keeps the longest agreeing prefix and then
its own token; sampling accepts a draft with probability min(1, p/q), else draws from the residual,
so the output is distributed exactly as plain decoding's.

Rolling back (Rollback): attention layers are cut with the cache's own `crop`; sliding-window
layers (Gemma 4) record their past so that `crop` can cut them too; linear-attention layers (Qwen3.5's
Gated DeltaNet) cannot be cut, so their recurrent and convolution state (and count of tokens read) is
copied before verifying and, when a draft is rejected, put back and the accepted tokens run again.

Drafting never costs much for long: a step whose drafts are all rejected pauses drafting for 1, 2,
4 … 64 steps (Backoff).
"""

from __future__ import annotations

import torch

from ..sampling import draft_choice, next_token, verified_token
from .config import SpeculativeConfig

__all__ = ["Backoff", "Drafting", "PromptLookup", "Rollback", "SpeculativeConfig", "judge"]


class PromptLookup:
    """Drafts for prompt lookup: the tokens that followed the latest earlier occurrence of the last n
    tokens. An index from each n-gram to where its latest occurrence ended is brought up to date when
    a proposal is asked for (not on the way to the first token, nor per token), so a proposal costs a
    few dictionary lookups, not a search of the context.
    (Written by hand: transformers' PromptLookupCandidateGenerator searches the whole context with
    tensor ops every step, and takes the earliest occurrence.)"""

    def __init__(self, ids: list[int], low: int, high: int) -> None:
        self.ids: list[int] = list(ids)
        self.low, self.high = low, high
        self._ends: dict[tuple[int, ...], int] = {}
        self._indexed = 0  # the n-grams ending before this position are in the index

    def append(self, token: int) -> None:
        self.ids.append(token)

    def propose(self, count: int) -> list[int]:
        ids, ends = self.ids, self._ends
        # Every n-gram ending before the last token is "earlier": what follows it is known.
        for end in range(max(self._indexed, 1), len(ids)):
            for n in range(self.low, min(self.high, end) + 1):
                ends[tuple(ids[end - n:end])] = end
        self._indexed = len(ids)
        for n in range(min(self.high, len(ids)), self.low - 1, -1):
            start = ends.get(tuple(ids[-n:]))
            if start is not None:
                return ids[start:start + count]
        return []


class Backoff:
    """How many tokens to draft next: none for a while after a step whose drafts all failed (1, 2, 4 …
    64 steps), else the most allowed. (Not fewer after a partial acceptance: on CPU a pass of 2 or 3
    tokens costs as much as one of 8, bench/speculative.py.)"""

    def __init__(self, most: int) -> None:
        self.most = most
        self._pause = 0
        self._failures = 0

    def next_length(self) -> int:
        if self._pause:
            self._pause -= 1
            return 0
        return self.most

    def record(self, accepted: int) -> None:
        """After a pass: how many of its drafts stood."""
        if accepted == 0:
            self._failures += 1
            self._pause = min(2 ** (self._failures - 1), 64)
        else:
            self._failures = 0


class Rollback:
    """Cuts a model's cache back after a verification pass: see the module's docstring."""

    def __init__(self, cache) -> None:
        from transformers.cache_utils import DynamicSlidingWindowLayer, LinearAttentionCacheLayerMixin

        layers = getattr(cache, "layers", [])
        self.linear = [layer for layer in layers if isinstance(layer, LinearAttentionCacheLayerMixin)]
        self.sliding = [layer for layer in layers if isinstance(layer, DynamicSlidingWindowLayer)]
        for layer in self.sliding:
            layer.activate_past_recording()
        self.attention = [layer for layer in layers if not isinstance(layer, LinearAttentionCacheLayerMixin)]
        self._saved: list | None = None

    def before(self) -> None:
        """Called before a pass that may be cut back: the state that cannot be cut is copied."""
        if self.linear:
            self._saved = [({i: s.clone() for i, s in layer.conv_states.items() if s is not None},
                            {i: s.clone() for i, s in layer.recurrent_states.items() if s is not None},
                            _length_count(layer))
                           for layer in self.linear]

    def after(self, fed: int, kept: int) -> int | None:
        """After a pass of `fed` tokens of which the first `kept` stand: the attention layers are cut
        to them. Returns None when that is all, or, where linear-attention state had to be put back,
        the count of tokens the caller must run again."""
        drop = fed - kept
        if self.linear and drop:
            for layer, (conv, recurrent, length) in zip(self.linear, self._saved):
                for i, state in conv.items():
                    layer.conv_states[i] = state
                for i, state in recurrent.items():
                    layer.recurrent_states[i] = state
                if length is not None:
                    layer.cumulative_length_linear.copy_(length)  # in place: the tensor's address is kept static
            for layer in self.attention:
                layer.crop(-fed)  # back to before the pass: the kept tokens go in again
            self._saved = None
            return kept
        for layer in self.attention:
            layer.crop(-drop)  # crop(0) also trims a sliding window that recorded its past
        self._saved = None
        return None

    def trim(self) -> None:
        """After a plain one-token step: a sliding window that records its past is cut back to size."""
        for layer in self.sliding:
            layer.crop(0)


def _length_count(layer) -> torch.Tensor | None:
    """A linear-attention layer's count of the tokens it has read (transformers 5.25 on; None before).
    It must be put back with the state: the cache's length, which positions the next tokens, is
    read from the first layer, a linear one in Qwen3.5, and a count left at the rejected drafts
    moves every later rotary position of the attention layers."""
    count = getattr(layer, "cumulative_length_linear", None)
    return None if count is None else count.clone()


def judge(rows, drafts: list[int], sampling, generator, penalties, q: list[torch.Tensor] | None = None) -> list[tuple]:
    """The tokens one verification pass gives, as (choice, drafted, accepted): each draft checked
    against the target's logits (`rows[i]`: after the last accepted token and drafts[:i]) until one
    is rejected, its replacement ending the list; when all stand, the token after them as well.
    `q`: a drafter's distribution for each draft (None: drafts copied from the context).
    Shared by every backend that verifies drafts, so they all accept by the same rules."""
    out: list[tuple] = []
    for i, (row, draft) in enumerate(zip(rows, drafts)):
        choice = verified_token(row, sampling, generator, penalties, draft, q[i] if q else None)
        if penalties is not None:
            penalties.add(choice.token_id)
        stood = choice.token_id == draft
        out.append((choice, 1, int(stood)))
        if not stood:
            return out
    choice = next_token(rows[len(drafts)], sampling, generator, penalties)
    if penalties is not None:
        penalties.add(choice.token_id)
    out.append((choice, 0, 0))
    return out


def verify_pass(model, tokens: list[int], cache, device) -> torch.Tensor:
    """The target's logits after each of `tokens` (the last accepted one, then the drafts): one row each."""
    out = model(input_ids=torch.tensor([tokens], device=device), cache=cache, use_cache=True)
    return out.logits[0].float()


class Drafting:
    """One request's speculative decoding: proposes drafts after each token, verifies them, and keeps
    the counts the `done` event reports. Runs on the decode thread, with the request's cache.
    `proposer`: what drafts (suffix decoding, an MTP drafter); else prompt lookup, or `drafter`, a
    draft model. Its `propose(count)` and `append(token)` are all it must have; `probs` (the
    drafter's distribution of each draft), `verified(accepted)` and `tap` are read when it has them
    (its `finish()` is the backend's to call, when the request ends however it ends)."""

    def __init__(self, config: SpeculativeConfig, model, cache, prompt_ids: list[int], sampling, generator,
                 penalties, device, drafter=None, proposer=None) -> None:
        self.model, self.cache, self.device = model, cache, device
        self.sampling, self.generator, self.penalties = sampling, generator, penalties
        self.method = config.method  # each drafted token's, as traced
        if proposer is not None:
            self.lookup = proposer
        elif drafter is not None:  # draft_model: proposals with the drafter's distribution
            self.lookup = DraftModel(drafter, prompt_ids, sampling, generator, device)
        else:
            self.lookup = PromptLookup(prompt_ids, config.prompt_lookup_min, config.prompt_lookup_max)
        self.backoff = Backoff(config.num_speculative_tokens or 1)
        self.rollback = Rollback(cache)
        self.drafts = self.drafted = self.accepted = 0

    def seen(self, token: int) -> None:
        """Every generated token, as it is emitted: the context drafts are looked up in."""
        self.lookup.append(token)

    def step(self, last: int, room: int) -> list[tuple]:
        """After `last` (emitted, not yet in the cache): the next tokens as (choice, drafted,
        accepted), one verification pass's worth; [] when there is nothing worth drafting (the
        caller then takes a plain step). `room`: how many tokens may still be generated."""
        length = min(self.backoff.next_length(), room - 1)
        drafts = self.lookup.propose(length) if length > 0 else []
        if not drafts:
            return []
        sampling, generator, penalties = self.sampling, self.generator, self.penalties
        self.rollback.before()
        rows = verify_pass(self.model, [last, *drafts], self.cache, self.device)
        q = getattr(self.lookup, "probs", None)  # a drafter's distributions; None for copied drafts
        out = judge(rows, drafts, sampling, generator, penalties, q)
        accepted = sum(stood for _, _, stood in out)
        verified = getattr(self.lookup, "verified", None)
        if verified is not None:
            verified(accepted)
        again = self.rollback.after(len(drafts) + 1, accepted + 1)
        if again:  # linear-attention state was put back: the tokens that stand go in again
            tap = getattr(self.lookup, "tap", None)
            if tap is not None:
                tap.paused = True  # the drafter has these positions' hidden states from the pass
            self.model(input_ids=torch.tensor([[last, *drafts[:accepted]]], device=self.device), cache=self.cache,
                       use_cache=True, logits_to_keep=1)
            if tap is not None:
                tap.paused = False
        self.backoff.record(accepted)
        self.drafts += 1
        self.drafted += len(drafts)
        self.accepted += accepted
        return out

    def trim(self) -> None:
        """After a plain step (see Rollback.trim)."""
        self.rollback.trim()


class DraftModel:
    """Drafts from a smaller model with the same tokenizer, decoded with a cache of its own: greedy
    for a greedy request, else drawn from its distribution q (kept in `probs` for the verification).
    Its cache is cut back after each verification as the target's is (Rollback)."""

    def __init__(self, model, prompt_ids: list[int], sampling, generator, device) -> None:
        self.model, self.sampling, self.generator, self.device = model, sampling, generator, device
        self.ids: list[int] = list(prompt_ids)
        self.cache = None
        self.rollback: Rollback | None = None
        self.fed = 0  # how many of `ids` its cache holds
        self.probs: list[torch.Tensor] | None = None
        self._drafts: list[int] = []
        # Its prefill waits for the first proposal: the first token goes out without waiting for it.

    def append(self, token: int) -> None:
        self.ids.append(token)

    def propose(self, count: int) -> list[int]:
        logits = self._forward(self.ids[self.fed:])
        self.fed = len(self.ids)
        self.rollback.before()
        drafts, probs = [], []
        for i in range(count):
            token = draft_choice(logits, self.sampling, self.generator, probs)
            drafts.append(token)
            if i < count - 1:  # the last draft's state is not needed unless it stands
                logits = self._forward([token])
        self._drafts, self.probs = drafts, probs or None
        return drafts

    def verified(self, accepted: int) -> None:
        """`accepted` drafts stood: those its cache holds stay (they are the context now), the rest go."""
        held = len(self._drafts) - 1
        kept = min(accepted, held)
        if self.rollback.after(held, kept) and kept:  # linear-attention state put back: they go in again
            self._forward(self._drafts[:kept])
        self.fed += kept

    def _forward(self, tokens: list[int]) -> torch.Tensor:
        out = self.model(input_ids=torch.tensor([tokens], device=self.device), cache=self.cache, use_cache=True,
                         logits_to_keep=1)
        if self.cache is None:
            self.cache = out.cache
            self.rollback = Rollback(self.cache)
        return out.logits[0, -1].float()
