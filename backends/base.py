"""What every backend takes (a DecodeRequest) and promises (the Backend protocol); the events it
yields are in events.py.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypedDict

from looptrace.common.checkpoint import Checkpoint
from looptrace.common.vocabulary import Vocabulary

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
    # Headers carrying our trace context (W3C traceparent) to a server behind, for backends that
    # forward: what the engine's observers return from `submitted`.
    trace_headers: dict[str, str] = field(default_factory=dict)
    conversation: str | None = None  # the agent session it belongs to: several servers keep it on one
    # Prefix caches find only what was kept under the same salt (one per tenant; None: no tenant): vLLM's
    # cache_salt, the key of the local backends' kept states beside the ids.
    cache_salt: str | None = None
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




class TokenScore(TypedDict):
    """One token of a given answer as a model reads it after a given prompt (scoring.py): teacher
    forced, nothing generated; at T = 1, as the token events report p."""

    id: int  # the answer's token
    logprob: float  # the model's logprob of it
    rank: int  # 1: the most likely (tokens tied with it share its rank)
    greedy_id: int  # what the model would have chosen greedily here (lowest id first on ties)
    greedy_logprob: float


class Backend(Protocol):
    """Every member the server reads of a backend; nothing else is read.

    In-process backends (local, llama.cpp) decode on a thread of their own (decode_thread.py);
    relaying ones (vLLM) are async HTTP clients; the event loop never runs model code."""

    name: str  # as the registry names it: on /health and the decode span
    route: str | None  # how tokens are asked for, where a backend has several ways (vLLM's two routes)
    # Whether the items go as they came (with the prompt as the template writes it) for the server
    # behind to expand (vLLM), rather than as the processor's tensors.
    expands_media: bool

    @property
    def media_refusal(self) -> str:
        """Why this backend cannot take media now, for the client's 400; "" when it can."""

    @property
    def running(self) -> int:
        """Requests being decoded now."""

    @property
    def waiting(self) -> int:
        """Requests queued here for the model (0 where the server behind queues them)."""

    @property
    def serving(self) -> bool:
        """Whether it can take requests now (False while every vLLM server is unreachable)."""

    @property
    def upstreams(self) -> Sequence[Upstream]:
        """The servers it forwards to, for their metrics; empty for a backend that decodes here."""

    def health_details(self) -> dict:
        """What /health adds about it: its prefix cache, its speculative decoding as configured, what
        it runs on (llama.cpp's threads and context), its servers."""

    def generate(self, request: DecodeRequest) -> AsyncIterator[Event]:
        """prefill, one token event per token, done; a failure raises BackendError."""

    async def score(self, prompt_ids: list[int], answer_ids: list[int],
                    cache_salt: str | None = None) -> list[TokenScore]:
        """Each answer token's score after the prompt, read in one prefill of prompt + answer (nothing
        generated); a backend that cannot (registry's Capabilities.score) raises BackendError.
        `cache_salt`: as DecodeRequest's."""

    async def close(self) -> None: ...


class Upstream(Protocol):
    """A server a backend forwards to, as its metrics read it."""

    name: str  # "host:port", from the command line: never a client's string
    serving: bool
    running: int


@dataclass(frozen=True, slots=True)
class TextModel:
    """What the server read of the checkpoint before the backend loads: its config, where its files
    are, its vocabulary, and whether its family takes media."""

    checkpoint: Checkpoint
    vocab: Vocabulary
    media: bool  # the family's processor takes images (audio, video): the local backend loads the vision tower
    max_model_len: int  # the context allowed (the loader's `context` decided it)


class LoaderHost(Protocol):
    """What the server lends a loader (the runtime implements it)."""

    def waiting(self, reason: str) -> None:
        """Why the backend is not ready yet (no vLLM server answers): /health says it, and requests get
        a 503 saying it instead of waiting."""

    def stored_steps(self, spec: str) -> list[dict]:
        """Recorded steps from the trace store (--replay ID[,ID…] or conversation:ID)."""


class Loader:
    """How one backend comes up, in the order the runtime calls it; one per registry entry
    (registry.py). The defaults suit a backend that decodes MODEL's own checkpoint here."""

    def __init__(self, settings, host: LoaderHost) -> None:
        self.settings, self.host = settings, host

    async def connect(self) -> str | None:
        """Before the checkpoint is read: reach what the backend depends on. The served model's name
        when the backend learns it there (a vLLM server names it), else None."""
        return None

    def checkpoint_source(self) -> str:
        """Where the checkpoint's tokenizer, chat template and config are read."""
        return self.settings.model

    def context(self, asked: int | None, checkpoint: int) -> int:
        """The context to allow: --max-model-len when given (`asked`), else the checkpoint's, as this
        backend can hold it."""
        return asked or checkpoint

    def load(self, model: TextModel) -> Backend:
        """The backend, ready (on a worker thread: loading weights takes seconds to minutes)."""
        raise NotImplementedError

    def health_details(self) -> dict:
        """What /health says while the backend loads (the servers it waits for)."""
        return {}

    async def close(self) -> None:
        """What `connect` opened, when loading failed before a backend took it over."""
