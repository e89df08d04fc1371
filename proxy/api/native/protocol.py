"""The bodies of looptrace's own routes, in one place, parsed once at the door: a fork (fork.py), a
prompt of token ids decoded (generate.py), an answer scored (score.py). Their sampling settings and
tools are Chat Completions' (openai/chat/protocol.py); a token id's place in the served vocabulary is
checked where the vocabulary is known (stored_run.token_ids)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from ..openai.chat.protocol import FunctionTool, Sampling
from ..protocol import Protocol, capped


class ForkRequest(Sampling):
    """{"index": N, "token_id": ID} or {"index": N, "text": "..."}: what to put at generated token N."""

    index: int
    token_id: int | None = None
    text: str | None = None
    max_tokens: int | None = Field(None, ge=1)  # none: as long as the original could have run, from there


class Served(Protocol):
    model: str | None = None  # if given, the one served


class GenerateRequest(Served, Sampling):
    prompt_ids: list[int]
    answer_prefix: list[int] | None = None  # what the answer starts with, forced
    thinking: bool | None = None  # none: as the family reads the prompt's end
    tools: Annotated[list[FunctionTool], capped("tools", "tools")] | None = None
    max_tokens: int | None = Field(None, ge=1)


class ScoreRequest(Served):
    prompt_ids: list[int]
    answer_ids: list[int]
