"""Model families: which checkpoints looptrace can serve, and how to talk to each.

`family_for_config` picks a family from config.json before any weights are fetched; the loader
then builds it with the checkpoint's tokenizer (ChatML also checks the template there).
"""

from __future__ import annotations

from .base import (
    CONTENT,
    THOUGHT,
    TOOL_CALL,
    Family,
    Parser,
    Rendered,
    RenderError,
    UnsupportedModel,
)
from .chatml import ChatML, chat_template_is_chatml
from .gemma4 import Gemma4
from .qwen3_5 import Qwen3_5

# Order matters for the architectures fallback: "Qwen3_5…" must be tried before "Qwen3…".
FAMILIES: tuple[type[Family], ...] = (Gemma4, Qwen3_5, ChatML)

__all__ = [
    "CONTENT", "THOUGHT", "TOOL_CALL", "FAMILIES", "ChatML", "Family", "Gemma4", "Parser", "Qwen3_5",
    "Rendered", "RenderError", "UnsupportedModel", "chat_template_is_chatml", "family_for_config",
]


def family_for_config(config: dict) -> type[Family]:
    """The family for a checkpoint's config.json: by model_type, else by architectures."""
    for family in FAMILIES:
        if family.matches(config):
            return family
    for family in FAMILIES:
        if family.matches_architecture(config):
            return family
    supported = ", ".join(t for family in FAMILIES for t in family.model_types)
    raise UnsupportedModel(
        f"unsupported model: model_type {config.get('model_type')!r}, architectures "
        f"{config.get('architectures')!r}; supported model types: {supported}")
