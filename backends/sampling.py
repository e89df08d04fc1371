"""Choosing the next token, and reporting how likely the model found it.

Written by hand rather than with transformers' logits processors: the order of the steps is part of
what we promise (logits ÷ T → top-k → softmax → top-p, keeping at least one → renormalise → draw),
and the report needs the model's own distribution beside the processed one.
"""

from __future__ import annotations

import torch

from .base import TOP_N, SamplingParams


def choose(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """The next token id (a 0-d tensor) from one row of float32 logits."""
    if params.temperature <= 0:
        # argmax returns the first maximum: equally likely tokens go lowest id first, as generate() does.
        return logits.argmax()
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
    return torch.multinomial(probs, 1, generator=generator)[0]


def report(logits: torch.Tensor, token: torch.Tensor) -> list[float]:
    """[id, logprob, rank, top ids…, top logprobs…] of `token` under the model's own distribution.

    One packed tensor, read back with one `.tolist()`, so a GPU step syncs once, not per field.
    """
    logprobs = torch.log_softmax(logits, dim=-1)
    chosen = logprobs[token]
    rank = (logprobs > chosen).sum() + 1
    top = torch.topk(logprobs, min(TOP_N, logprobs.numel()))
    return torch.cat(
        (
            token.reshape(1).double(),
            chosen.reshape(1).double(),
            rank.reshape(1).double(),
            top.indices.double(),
            top.values.double(),
        )
    ).tolist()


def generator_for(params: SamplingParams, device: torch.device) -> torch.Generator | None:
    if params.temperature <= 0:
        return None
    generator = torch.Generator(device=device)
    if params.seed is not None:
        generator.manual_seed(params.seed)
    else:
        generator.seed()
    return generator
