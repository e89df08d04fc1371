"""Token continuity (`--token-continuity off|check|keep`, or a request's own): whether a turn's prompt
holds what the model read and wrote on the turn before, as ids.

A harness sends its conversation again each turn, the model's answer as text, and the template
renders it again (families/continuity.py says how templates rewrite earlier turns). A trainer learns
from the ids the model sampled; a prompt that holds other ids for them is off policy. A turn
*continues* the last (memory.py keeps what it was asked and answered: turn_digests.py) when it is asked
with the same tools and template settings, its messages are the last turn's, then the model's answer
as its parser read it, then new ones; else it is a FORK (history edited or compacted, an answer the
model did not write, other tools or settings, a system message the template would move before the
answer), rendered as always. A turn that continues:

- *check* renders as always and classifies the turn: CLEAN (the prompt starts with the previous
  prompt and the sampled ids), REALIGN (the same conversation, other ids: the template or the
  tokenizer rewrote something);
- *keep* builds the prompt as the previous prompt's ids + the sampled ids, exactly + the template's
  rendering of only what follows the answer, where the template's rendering proves that splice
  (families/continuity.py): the model reads what it wrote, as a trainer will (KEPT); where it does not,
  the turn is rendered as always and classified as `check` does.

A prompt with media is rendered as always (its items are expanded by a processor), and classified.
"""

from __future__ import annotations

from dataclasses import dataclass

from looptrace.common.sequences import common_prefix
from looptrace.families.base import Family, Rendered
from looptrace.families.continuity import continued

from .memory import LastTurn
from .request import GenerationRequest
from .turn_digests import Asked, is_the_answer

MODES = ("off", "check", "keep")
CLEAN, REALIGN, FORK, KEPT = "clean", "realign", "fork", "kept"
CLASSES = (CLEAN, REALIGN, FORK, KEPT)
# Why a turn is a FORK: its history is not the last turn's messages, then the model's answer; or it was
# asked with other tools or template settings; or a system message after the answer that the template
# joins into the first (Family.system_first_only) changes the text before it.
HISTORY, ANSWER, SETTINGS, SYSTEM = "history", "answer", "settings", "system"


@dataclass(frozen=True, slots=True)
class Continuity:
    """How a turn's prompt continues the conversation's last: `kind` None when there was none to
    continue (a first turn, a request without a conversation, `off`, a last turn without continuity)."""

    mode: str = "off"
    kind: str | None = None
    differs_at: int | None = None  # REALIGN: the first prompt id that is not the previous prompt's or answer's
    kept: int = 0  # KEPT: the answer's ids kept as sampled
    fork: str | None = None  # FORK: why (HISTORY, ANSWER, SETTINGS, SYSTEM)


def render_turn(family: Family, request: GenerationRequest, messages: list[dict], tools: list[dict] | None,
                mode: str, previous: LastTurn | None, asked: Asked | None, *, media: bool,
                template_ids: bool) -> tuple[Rendered, Continuity]:
    """The turn's prompt, and how it continues the last. `messages`: the request's, media decoded;
    `previous`: the conversation's last turn; `asked`: this request's digests (turn_digests.py).
    Raises the family's RenderError."""
    def whole() -> Rendered:
        return family.render(messages, tools, request.enable_thinking, media=media, template_ids=template_ids,
                             conversation=request.conversation, salt=request.cache_salt)

    last = previous.digests if previous is not None else None
    if mode == "off" or last is None or asked is None:
        return whole(), Continuity(mode)
    fork = departure(family, request.messages, asked, previous)
    if fork is not None:
        return whole(), Continuity(mode, FORK, fork=fork)
    if mode == "keep" and not media:
        rendered, spliced = continued(family, messages, len(last.messages), tools, request.enable_thinking,
                                      previous.prompt, previous.sampled, conversation=request.conversation,
                                      encoding=previous.encoding, salt=request.cache_salt)
        if spliced:
            return rendered, Continuity(mode, KEPT, kept=len(previous.sampled))
    else:
        rendered = whole()
    expected = previous.ids
    at = common_prefix(rendered.ids, expected)
    return rendered, Continuity(mode, CLEAN) if at == len(expected) else Continuity(mode, REALIGN, at)


def departure(family: Family, messages: list[dict], asked: Asked, previous: LastTurn) -> str | None:
    """Why `messages`, asked as `asked`, do not continue `previous` (a FORK), or None when they do: the
    same tools and settings; the previous request's messages, then the model's answer (the assistant's
    message, as its parser read it: turn_digests.py), then new ones, of which no system message the
    template would move before the answer."""
    last = previous.digests
    n = len(last.messages)
    if asked.settings != last.settings:
        return SETTINGS
    if len(messages) <= n or asked.messages[:n] != last.messages:
        return HISTORY
    if messages[n].get("role") != "assistant" or not is_the_answer(messages[n], last.answer):
        return ANSWER
    if family.system_first_only and any(m.get("role") == "system" for m in messages[n + 1:]):
        return SYSTEM
    return None
