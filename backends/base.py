"""What every backend takes (a DecodeRequest) and promises (the Backend protocol); the events it
yields are in events.py.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, AsyncIterator, Protocol

if TYPE_CHECKING:
    from .events import Event


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


GREEDY_BELOW = 1e-5  # a temperature this low decodes greedily, as vLLM's sampler does: logits ÷ 1e-300 overflow


@dataclass(slots=True)
class SamplingParams:
    temperature: float = 1.0  # 0 (or below GREEDY_BELOW) means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 means no limit
    seed: int | None = None
    # OpenAI's penalties, on the tokens generated so far (as vLLM applies them): a token's logit loses
    # `presence_penalty` once it has appeared and `frequency_penalty` for every time it has.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

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
    conversation: str | None = None  # the agent session it belongs to: several servers keep it on one
    # The prompt length whose state a prefix cache should keep: what the conversation's next request
    # will start with (None: the whole prompt).
    keep_at: int | None = None
    # The processor's tensors for the prompt's media (pixel values, grids, token types), which the
    # model reads in prefill beside the ids; None for a prompt of text alone.
    media: dict | None = None
    media_key: tuple = ()  # (offset, length, sha256) of each item's tokens: what a prefix cache keys on
    # For a server that expands media itself (vLLM): the prompt as the template writes it, each item
    # one placeholder, and the items as (kind, data URL), in order. `prompt_ids` stays the expanded
    # prompt, as this server's processor counts it.
    template_ids: list[int] | None = None
    media_urls: list[tuple[str, str]] = field(default_factory=list)




class Backend(Protocol):
    """What the engine and the server rely on, from every backend."""

    name: str  # "local", "vllm", "replay": on /health and the decode span
    route: str | None  # how tokens are asked for, where a backend has several ways (vLLM's two routes)
    # Whether the items go as they came (with the prompt as the template writes it) for the server
    # behind to expand (vLLM), rather than as the processor's tensors.
    expands_media: bool
    # Why this backend cannot take media now, for the client's 400; "" when it can.
    media_refusal: str

    @property
    def running(self) -> int:
        """Requests being decoded now."""

    @property
    def waiting(self) -> int:
        """Requests queued here for the model (0 where the server behind queues them)."""

    def prefix_cache_stats(self) -> dict | None:
        """{"prompts", "tokens", "max_tokens"} kept for later turns, or None without a prefix cache."""

    def generate(self, request: DecodeRequest) -> AsyncIterator[Event]:
        """prefill, one token event per token, done; a failure raises BackendError."""

    async def close(self) -> None: ...
