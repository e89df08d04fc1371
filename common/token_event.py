"""One generated token as every backend reports it (backends/events.py builds it) and the trace store
packs it (trace_store/tokens.py): here, below both, so that storage depends on no backend."""

from __future__ import annotations

from typing import Literal, TypedDict

TOP_N = 5  # the most likely tokens reported with each token


class TokenEvent(TypedDict):
    type: Literal["token"]
    index: int
    id: int
    piece: str
    text: str
    special: bool
    logprob: float
    p: float
    rank: int | None  # None: the server did not say, and the token is outside the top five
    top_ids: list[int]
    top_logprobs: list[float]
    # Speculative decoding, where the backend knows it token by token (local): 1 when this position
    # held a drafted token, and 1 when the draft stood (the token is the draft).
    drafted: int
    accepted: int
    draft_method: str  # which method drafted it (speculative/config.py's METHODS), "" where nothing was drafted
