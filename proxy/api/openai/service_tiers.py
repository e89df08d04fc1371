"""`service_tier`, which both OpenAI APIs take (codex sends "priority" for its fast mode, "flex" for its
slow one): accepted, and said back as the tier that served the request, as OpenAI's answers do.

This server has one tier, so the answer repeats what was asked; "auto" (and no tier at all) is served
as "default", which is what OpenAI answers for a project without a tier of its own. A value outside
OpenAI's list is refused in OpenAI's words (the enum refusal its servers give every field), less the value itself.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator

from ..protocol import refused

TIERS = ("auto", "default", "flex", "scale", "priority")


def _known(value: str) -> str:
    if value not in TIERS:
        supported = ", ".join(f"'{tier}'" for tier in TIERS[:-1]) + f", and '{TIERS[-1]}'"
        # OpenAI's words, less the value: it is the client's, and the message is a template (its {param}).
        raise refused("invalid_value", f"Invalid value for '{{param}}'. Supported values are: {supported}.")
    return value


ServiceTier = Annotated[str, AfterValidator(_known)]


def served(asked: str | None) -> str:
    """The tier an answer names: the one asked for, "auto" resolved to "default"."""
    return "default" if asked in (None, "auto") else asked
