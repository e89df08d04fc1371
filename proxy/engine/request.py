"""What the API adapters hand the engine: one request, whatever API it came from, and what a run
yields per token."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from looptrace.backends.events import TokenEvent
from looptrace.families.deltas import Delta
from looptrace.families.media.plan import MediaPlan

from .memory import Recall


@dataclass(frozen=True, slots=True)
class StoredPrompt:
    """A prompt already rendered (a stored trace's), run again without rendering: how a fork starts."""

    ids: list[int]
    thinking: bool  # the prompt leaves the model inside its thinking channel
    answer_prefix: list[int] = field(default_factory=list)  # tokens the answer starts with, as if generated
    # How many of answer_prefix's last tokens a client typed (a fork's text): the model reads them, the
    # answer shows them as text, and the parser never reads them as markup (a call, a thought).
    typed: int = 0


@dataclass(slots=True)
class GenerationRequest:
    messages: list[dict]  # Hugging Face's common format; tool-call arguments as dicts
    tools: list[dict] | None = None  # OpenAI function tools
    tool_choice: str | dict = "auto"  # "auto" | "none" | "required" | {"name": NAME}
    parallel_tool_calls: bool = True
    enable_thinking: bool | None = None  # None: the template's own default
    max_tokens: int | None = None
    max_tokens_param: str = "max_tokens"  # the field the client used, for error messages
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop: list[str] = field(default_factory=list)
    top_logprobs: int | None = None  # None: no logprobs asked for
    stored: StoredPrompt | None = None  # run this prompt instead of rendering `messages`
    conversation: str | None = None  # the agent session, as the client names it (api/clients.py)
    continuity: str | None = None  # token continuity for this request (off, check, keep); None: the server's
    # What keeps the caller's tenant's cached prefixes apart from every other's (api/cache_salts.py): vLLM's
    # cache_salt, and a key of the render cache and the local backends' kept states. None: no tenant.
    cache_salt: str | None = None
    # The conversation's memory (memory.py), opened by the API for a request that names its conversation:
    # its last turn, read as the prompt is rendered, and this turn, kept as its answer completes.
    memory: Recall | None = None
    # The attached items, found once in `messages` (the API put them there as parts): every later
    # step reads this plan instead of walking the conversation again.
    media: MediaPlan = field(init=False)

    def __post_init__(self) -> None:
        self.media = MediaPlan.of(self.messages)


class Step(NamedTuple):
    """What one turn of `Generation.run()` yields."""

    token: TokenEvent | None  # None for deltas not tied to a token (a forced prefix, the parser's flush)
    channel: str | None  # where the token fell: THOUGHT, CONTENT or TOOL_CALL
    deltas: list[Delta]  # what the client sees of it: thinking, text, tool calls
