"""Choosing the next token, and reporting how likely the model found it.

Written by hand rather than with transformers' logits processors: the order of the steps is part of
what we promise (logits ÷ T → top-k → softmax → top-p, keeping at least one → renormalise → draw),
and the report needs the model's own distribution beside the processed one.
"""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple

import numpy as np
import torch

from .base import SamplingParams
from .events import TOP_N


class Choice(NamedTuple):
    """The chosen token and the model's own view of it (T = 1, no penalties)."""

    token_id: int
    logprob: float
    rank: int  # 1 for the most likely token
    top_ids: list[int]  # the TOP_N most likely tokens, most likely first
    top_logprobs: list[float]


def choose(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """The next token id (a 0-d tensor) from one row of float32 logits."""
    if params.greedy:
        # argmax returns the first maximum: equally likely tokens go lowest id first, as generate() does.
        return logits.argmax()
    return torch.multinomial(probabilities(logits, params), 1, generator=generator)[0]


def draft_choice(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None,
                 probs: list[torch.Tensor]) -> int:
    """A drafter's token from one row of float32 logits; when sampling, the distribution it was drawn
    from is appended to `probs` (the verification rule needs it: sampling.judge's q)."""
    if params.greedy:
        return int(logits.argmax())
    q = probabilities(logits, params)
    probs.append(q)
    return int(torch.multinomial(q, 1, generator=generator))


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a sampling request draws from: the logits after temperature, top-k and top-p."""
    scores = logits / params.temperature
    if 0 < params.top_k < scores.numel():
        kth = torch.topk(scores, params.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        # Drop a token when the ones before it already reach top_p; the first one always stays.
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(before >= params.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
        probs = probs / probs.sum()
    return probs


class Penalties:
    """The logit offsets of the presence and frequency penalties, kept up to date token by token."""

    def __init__(self, params: SamplingParams, logits: torch.Tensor) -> None:
        self.presence, self.frequency = params.presence_penalty, params.frequency_penalty
        self.offsets = torch.zeros_like(logits)
        self._seen: set[int] = set()

    def add(self, token_id: int) -> None:
        # One scalar update per token rather than recounting the whole output every step.
        step = self.frequency + (0.0 if token_id in self._seen else self.presence)
        self._seen.add(token_id)
        if step:
            self.offsets[token_id] += step


def next_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None,
               penalties: Penalties | None = None) -> Choice:
    """Choose the next token and report it.

    The figures are under the model's own distribution (T = 1), whatever the sampling settings
    (penalties included: they change the choice, not what the model thought).
    One packed tensor is read back with one `.tolist()`, so a GPU step syncs once, not per field.
    Greedy needs no argmax of its own: the top five already hold the answer (argmax over the whole
    vocabulary, 90 µs on these CPUs, is only the fallback for a tie the five cannot settle).
    """
    if params.greedy and penalties is None:
        top = torch.topk(logits, min(TOP_N, logits.numel()))
        norm = torch.logsumexp(logits, dim=-1)
        n = top.indices.numel()
        numbers = torch.cat((top.indices.double(), (top.values - norm).double())).tolist()
        ids, logprobs = [int(i) for i in numbers[:n]], numbers[n:]
        # topk leaves the order of equal values open; greedy takes the lowest id, as generate() does.
        tied = [i for i, lp in zip(ids, logprobs) if lp == logprobs[0]]
        token = min(tied) if len(tied) < n else int(logits.argmax())
        return Choice(token, logprobs[0], 1, ids, logprobs)
    return report(logits, choose(logits if penalties is None else logits - penalties.offsets, params, generator))


def greedy_choice(logits: np.ndarray) -> Choice:
    """next_token's greedy choice and report for one row of float32 logits held as a numpy array (the
    llama.cpp backend's, read in place): the same token, top five and logprobs (in float32, so the
    last digits may differ), in about 70 µs where torch takes 160 on a 49,152-token vocabulary, which
    is 1 % of a step at llama.cpp's speed on a CPU. Five argmaxes rather than a sort: each takes the
    first of equal logits, so ties go lowest id first, as generate() takes them."""
    work = logits.copy()
    ids: list[int] = []
    while len(ids) < min(TOP_N, len(work)):
        i = int(work.argmax())
        if work[i] == -np.inf:  # fewer finite logits than five: the rest by id
            ids += itertools.islice((j for j in range(len(work)) if j not in ids), TOP_N - len(ids))
            break
        ids.append(i)
        work[i] = -np.inf
    top = logits[ids[0]]
    np.subtract(logits, top, out=work)
    norm = float(top) + math.log(float(np.exp(work, out=work).sum()))
    logprobs = [float(logits[i]) - norm for i in ids]
    return Choice(ids[0], logprobs[0], 1, ids, logprobs)


def verified_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None,
                   penalties: Penalties | None, draft: int, draft_probs: torch.Tensor | None = None) -> Choice:
    """The target's token at a drafted position, reported as next_token reports it.

    Greedy: its own choice (the draft stands when they agree). Sampling: speculative sampling, so
    the token is distributed exactly as `choose` would draw it: the draft is kept with probability
    min(1, p(draft) / q(draft)), else a token is drawn from the residual max(0, p - q), renormalised.
    `draft_probs` is q, the drafter's distribution; None for a draft copied from the context (prompt
    lookup), a certain proposal: q is 1 at the draft, and the residual is p without it."""
    if params.greedy:
        return next_token(logits, params, generator, penalties)
    probs = probabilities(logits if penalties is None else logits - penalties.offsets, params)
    p = probs[draft]
    q = draft_probs[draft] if draft_probs is not None else torch.ones((), device=probs.device)
    # One uniform draw per drafted position, compared on the device: no sync until the report below.
    u = torch.rand((), generator=generator, device=probs.device)
    if bool(u * q < p):  # u < p / q, without dividing by a q of 0
        token = torch.tensor(draft, device=probs.device)
    else:
        if draft_probs is None:
            residual = probs.clone()
            residual[draft] = 0.0
        else:
            residual = (probs - draft_probs).clamp_(min=0.0)
        total = residual.sum()
        residual = residual / total if bool(total > 0) else probs  # p == q everywhere: nothing left to correct
        token = torch.multinomial(residual, 1, generator=generator)[0]
    return report(logits, token)


def report(logits: torch.Tensor, token: torch.Tensor) -> Choice:
    """A chosen token with the model's own view of it (T = 1): its logprob, rank and the top five."""
    top = torch.topk(logits, min(TOP_N, logits.numel()))
    norm = torch.logsumexp(logits, dim=-1)
    n = top.indices.numel()
    chosen = logits[token]
    rank = (logits > chosen).sum() + 1
    numbers = torch.cat((
        token.reshape(1).double(),
        (chosen - norm).reshape(1).double(),
        rank.reshape(1).double(),
        top.indices.double(),
        (top.values - norm).double(),
    )).tolist()
    return Choice(int(numbers[0]), numbers[1], int(numbers[2]), [int(i) for i in numbers[3:3 + n]], numbers[3 + n:])


def generator_for(params: SamplingParams, device: torch.device) -> torch.Generator | None:
    if params.greedy:
        return None
    generator = torch.Generator(device=device)
    if params.seed is not None:
        generator.manual_seed(params.seed)
    else:
        generator.seed()
    return generator
