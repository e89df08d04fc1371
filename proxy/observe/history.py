"""A conversation's previous turn as token continuity (engine/continuity.py) reads it, from what
observation keeps between requests (conversations.py): the ids its model read and sampled, and
whether this request's messages start with that request's."""

from __future__ import annotations

from looptrace.common.jsonio import dumps

from ..engine.request import PreviousTurn
from . import genai
from .conversations import Turn


def previous_turn(turn: Turn, messages: list[dict]) -> PreviousTurn | None:
    """None when the conversation's previous turn left no ids or messages (a first turn, a request
    without a conversation, a turn before continuity was on). The messages are made JSON once: the
    render span's record of them (request_spans.py) reads the same."""
    if turn.conversation is None:
        return None
    jsons = turn.message_jsons = [dumps(genai.message(m)) for m in messages]
    shared, _ = turn.new_messages_from(jsons)
    recalled = turn.recalled()
    seen, prompt, digests = recalled.seen, recalled.seen_prompt, recalled.digests
    if not seen or not prompt or digests is None:
        return None
    return PreviousTurn(seen[:prompt], seen[prompt:], len(digests), shared == len(digests), recalled.encoding)
