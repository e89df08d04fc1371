"""What every backend takes and yields.

A backend turns prompt token ids into events, plain dicts with a `type` and the same fields from
every backend, so the code that consumes them never asks which backend produced them:

    {"type": "prefill", "prompt_tokens": int, "cached_tokens": int, "seconds": float}
    {"type": "token", "index": int, "id": int, "piece": str, "text": str, "special": bool,
     "logprob": float, "p": float, "rank": int,            # the model's own distribution (T = 1)
     "top_ids": [int], "top_logprobs": [float],            # the five most likely tokens
     "drafted": int, "accepted": int}                      # only when a draft model proposed it
    {"type": "done", "finish_reason": "stop" | "length" | "cancelled", "tokens": int,
     "seconds": float, "tokens_per_second": float, "drafts": int, "drafted": int, "accepted": int}

`text` is the token's share of the decoded output: the whole sequence is decoded incrementally, so
a character split across byte tokens arrives once, whole, and stop tokens contribute no text.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import AsyncIterator, Protocol

TOP_N = 5


class BackendError(Exception):
    """Generation failed for a reason the client should hear: `status` and `code` go to the API error."""

    def __init__(self, message: str, *, status: int = 502, code: str = "backend_error") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code


class Busy(BackendError):
    """The request queue is full; the client may retry later."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status=429, code="queue_full")


@dataclass(slots=True)
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 means no limit
    seed: int | None = None
    # OpenAI's penalties, on the tokens generated so far (as vLLM applies them): a token's logit loses
    # `presence_penalty` once it has appeared and `frequency_penalty` for every time it has.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    @property
    def penalised(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty)


@dataclass(slots=True)
class DecodeRequest:
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams
    stop_ids: frozenset[int]
    # Set by the consumer when the client goes away or a stop string matched; checked before every token.
    cancel: threading.Event = field(default_factory=threading.Event)
    traceparent: str | None = None  # W3C trace context, for backends that forward it
    # The prompt length whose state a prefix cache should keep: what the conversation's next request
    # will start with (None: the whole prompt).
    keep_at: int | None = None


class Backend(Protocol):
    name: str

    def generate(self, request: DecodeRequest) -> AsyncIterator[dict]: ...

    async def close(self) -> None: ...
