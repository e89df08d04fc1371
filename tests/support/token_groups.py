"""Token events shaped as a real model's, for the packing tests and the store's benchmarks: a
vocabulary's worth of pieces, logprobs a float32 model computes (every backend's are float32 values),
probabilities as backends/events.py derives them, top fives with a few common tokens among rarer
ones, a token a few milliseconds after the one before."""

from __future__ import annotations

import math
import random
from array import array

from looptrace.trace_store.tokens import GROUP, columns

VOCABULARY = 248_044  # Qwen3.5's
PIECES = [f"Ġw{i}" if i % 3 else f"p{i}" for i in range(VOCABULARY)]


def float32(value: float) -> float:
    return array("f", [value]).tolist()[0]


def event(index: int, token_id: int, logprob: float, rank: int | None, top_ids: list[int],
          top_logprobs: list[float]) -> dict:
    """A backend's token event (backends/events.py's token_event, p included)."""
    piece = PIECES[token_id] if 0 <= token_id < len(PIECES) else ""
    p = math.exp(logprob) if math.isfinite(logprob) or logprob == -math.inf else logprob
    return {"type": "token", "index": index, "id": token_id, "piece": piece, "text": piece.replace("Ġ", " "),
            "special": False, "logprob": logprob, "p": p, "rank": rank, "top_ids": top_ids,
            "top_logprobs": top_logprobs, "drafted": 0, "accepted": 0, "draft_method": ""}


def answer_events(tokens: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    common = [rng.randrange(VOCABULARY) for _ in range(300)]  # the words an answer keeps coming back to
    out = []
    for i in range(tokens):
        ids = [rng.choice(common) if rng.random() < 0.7 else rng.randrange(VOCABULARY) for _ in range(5)]
        top = sorted((float32(math.log(rng.random() ** 3 + 1e-9)) for _ in range(5)), reverse=True)
        rank = rng.choice([1, 1, 1, 1, 2, 3])
        out.append(event(i, ids[rank - 1], top[rank - 1], rank, ids, top))
    return out


def answer(tokens: int, seed: int = 0, start_ns: int = 1_700_000_000_000_000_000) -> list[dict]:
    """An answer's `looptrace.tokens` groups (tokens.py's columns), as the decode span carries them."""
    rng = random.Random(seed + 1)
    events = answer_events(tokens, seed)
    times, now = [], start_ns
    for _ in events:
        now += rng.randrange(5_000_000, 40_000_000)
        times.append(now)
    return [columns(events[i:i + GROUP], ["content"] * len(events[i:i + GROUP]), times[i:i + GROUP], PIECES)
            for i in range(0, tokens, GROUP)]
