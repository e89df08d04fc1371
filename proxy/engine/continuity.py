"""Token continuity (`--token-continuity off|check|keep`, or a request's own): whether a turn's prompt
holds what the model read and wrote on the turn before, as ids.

A harness sends its conversation again each turn, the model's answer as text, and the template
renders it again (families/continuity.py says how templates rewrite earlier turns). A trainer learns
from the ids the model sampled; a prompt that holds other ids for them is off policy. When a turn's
messages extend the previous turn's (its messages, then the assistant's answer, then new ones):

- *check* renders as always and classifies the turn: CLEAN (the prompt starts with the previous
  prompt and the sampled ids), REALIGN (the same conversation, other ids: the template or the
  tokenizer rewrote something); FORK when the messages do not extend the previous turn's (history
  edited, compacted, or an answer the model did not write);
- *keep* builds the prompt as the previous prompt's ids + the sampled ids, exactly + the template's
  rendering of only what follows the answer (cut at the turn-end marker that closes it): the model
  reads what it wrote, as a trainer will (KEPT); a FORK is rendered as always.

A prompt with media is rendered as always (its items are expanded by a processor), and classified.
"""

from __future__ import annotations

from dataclasses import dataclass

from looptrace.common.sequences import common_prefix
from looptrace.families.base import Family, Rendered
from looptrace.families.continuity import kept_tail, turns_closed
from looptrace.families.incremental import Encoding

from .request import GenerationRequest, PreviousTurn

MODES = ("off", "check", "keep")
CLEAN, REALIGN, FORK, KEPT = "clean", "realign", "fork", "kept"
CLASSES = (CLEAN, REALIGN, FORK, KEPT)
CONTEXT_IDS = 4  # ids before new text decoded with it, so that it decodes as it does in place


@dataclass(frozen=True, slots=True)
class Continuity:
    """How a turn's prompt continues the conversation's last: `kind` None when there was none to
    continue (a first turn, a request without a conversation, `off`)."""

    mode: str = "off"
    kind: str | None = None
    differs_at: int | None = None  # REALIGN: the first prompt id that is not the previous prompt's or answer's
    kept: int = 0  # KEPT: the answer's ids kept as sampled


def render_turn(family: Family, request: GenerationRequest, messages: list[dict], tools: list[dict] | None,
                mode: str, *, media: bool, template_ids: bool) -> tuple[Rendered, Continuity]:
    """The turn's prompt, and how it continues the last. `messages`: the request's, media decoded.
    Raises the family's RenderError."""
    def whole() -> Rendered:
        return family.render(messages, tools, request.enable_thinking, media=media, template_ids=template_ids,
                             conversation=request.conversation)

    previous = request.history(request.messages) if mode != "off" and request.history is not None else None
    if previous is None:
        return whole(), Continuity(mode)
    if not _extends(family, request.messages, previous):
        return whole(), Continuity(mode, FORK)
    if mode == "keep" and not media:
        kept = _kept(family, request, messages, tools, previous)
        if kept is not None:
            return kept, Continuity(mode, KEPT, kept=len(previous.sampled))
    rendered = whole()
    expected = previous.prompt + previous.sampled
    at = common_prefix(rendered.ids, expected)
    return rendered, Continuity(mode, CLEAN) if at == len(expected) else Continuity(mode, REALIGN, at)


def _extends(family: Family, messages: list[dict], previous: PreviousTurn) -> bool:
    """Whether `messages` are the previous request's, then the model's answer, then new ones. The
    answer is the message after the previous ones, the assistant's, whose text and tool names are in
    what the model wrote (a client sends the answer back as text, and may rewrite its spacing or the
    calls' JSON; one that says something else is an edited history)."""
    n = previous.messages
    if not previous.same_history or len(messages) <= n or messages[n].get("role") != "assistant":
        return False
    # The prompt's end too: a forced opening (a call's name) is the answer's, read before the sampled ids.
    written = family.encoder.decode_pieces([previous.prompt[-64:] + previous.sampled])[0]
    answer = messages[n]
    pieces = [_text(answer.get("content")), answer.get("reasoning_content") or ""]
    pieces += [(c.get("function") or {}).get("name") or "" for c in answer.get("tool_calls") or ()]
    return all(p.strip() in written for p in pieces if isinstance(p, str) and p.strip())


def _text(content) -> str:
    if isinstance(content, list):
        return "".join(p if isinstance(p, str) else p.get("text", "") for p in content if isinstance(p, (str, dict)))
    return content if isinstance(content, str) else ""


def _kept(family: Family, request: GenerationRequest, messages: list[dict], tools: list[dict] | None,
          previous: PreviousTurn) -> Rendered | None:
    """previous prompt + sampled ids + the template's rendering of what follows the answer; None where
    the template writes no turn-end marker for it (then the turn is rendered as always)."""
    found = kept_tail(family, messages, tools, request.enable_thinking, turns_closed(family, previous.prompt))
    if found is None:
        return None
    tail, head = found
    sampled = previous.sampled
    # The marker that closes the answer is the model's own where it sampled it, else the template's.
    added = tail.ids[1:] if sampled and sampled[-1] == tail.marker else tail.ids
    ids = previous.prompt + sampled + added
    kept = _previous_encoding(family, request.conversation, previous)
    before = kept.text if kept is not None else family.encoder.decode_pieces([previous.prompt])[0]
    base = kept.serial if kept is not None else 0
    context = previous.prompt[-CONTEXT_IDS:]
    lead, text = family.encoder.decode_pieces([context, context + sampled + added])
    text = before + (text[len(lead):] if text.startswith(lead) else family.encoder.decode_pieces([sampled + added])[0])
    serial = family.encoder.keep(request.conversation, head, ids, text, base=kept)
    return Rendered(text=text, ids=ids, thinking=family.prompt_leaves_thinking(text),
                    history_length=len(ids) - family.transient_tail_length(text, ids), encoding=serial,
                    reused_from=base, reused_ids=len(previous.prompt) if base else 0,
                    reused_chars=len(before) if base else 0)


def _previous_encoding(family: Family, conversation: str | None, previous: PreviousTurn) -> Encoding | None:
    """The encoding this process kept of the previous prompt (its text and ids); None where another
    process served it (then its text is decoded from its ids)."""
    kept = family.encoder.kept.get(conversation, "") if conversation else None
    if kept is not None and previous.encoding and kept.serial == previous.encoding \
            and len(kept.ids) == len(previous.prompt):
        return kept
    return None
