"""What the render span records of a prompt, beside its counts: the prompt itself (whole, or as what it
adds to the conversation's previous step), the template's digest, and the attached items."""

from __future__ import annotations

import base64
import functools
import hashlib

from looptrace.common import attributes as attr
from looptrace.families.base import Rendered

from ..engine.continuity import Continuity
from ..engine.generation import Generation


def stored_prompt(rendered: Rendered, forced_text: str, ids: list[int], new_text: str, base: str | None,
                  encoding: int, whole: bool = False) -> dict:
    """The prompt as the render span keeps it, with `new_text` (the part new since the conversation's
    last request). When it was encoded from the prompt of `base` (the conversation's previous step,
    whose prompt's encoding was `encoding`), what it adds to that one, from the cut where they part: a
    session's trace then grows with what is new, not with turns × context (trace_store/chains.py makes
    it whole on read). Else whole. `whole` (spans exported over OTLP): the whole prompt as well, which
    the store leaves out and the export keeps (chains.py's `compacted` and `exported`)."""
    if base and rendered.reused_from and rendered.reused_from == encoding:
        added = {attr.PROMPT_BASE_TRACE_ID: base, attr.PROMPT_BASE_TOKENS: rendered.reused_ids,
                 attr.PROMPT_BASE_CHARS: rendered.reused_chars, attr.PROMPT_ADDED_IDS: ids[rendered.reused_ids:],
                 attr.PROMPT_ADDED_TEXT: rendered.text[rendered.reused_chars:] + forced_text,
                 attr.PROMPT_NEW_TEXT: new_text}
        if not whole:
            return added  # the store's alone: nothing built that grows with the conversation
        return {**added, attr.PROMPT_TEXT: rendered.text + forced_text, attr.PROMPT_IDS: ids}
    return {attr.PROMPT_TEXT: rendered.text + forced_text, attr.PROMPT_IDS: ids, attr.PROMPT_NEW_TEXT: new_text}


def continuity_attributes(continuity: Continuity) -> dict:
    """How the prompt continues the conversation's last turn (engine/continuity.py), where it was asked."""
    if continuity.kind is None:
        return {}
    attributes = {attr.PROMPT_CONTINUITY: continuity.kind, attr.PROMPT_CONTINUITY_MODE: continuity.mode}
    if continuity.differs_at is not None:
        attributes[attr.PROMPT_CONTINUITY_DIFFERS_AT] = continuity.differs_at
    if continuity.fork is not None:
        attributes[attr.PROMPT_CONTINUITY_FORK] = continuity.fork
    if continuity.kept:
        attributes[attr.PROMPT_KEPT_TOKENS] = continuity.kept
    return attributes


def template_hash(tokenizer) -> str:
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):
        template = "".join(template.get(k, "") for k in sorted(template))
    return _sha256(template)


@functools.lru_cache(maxsize=8)
def _sha256(text: str) -> str:
    # Once per template, not per request: a str keeps its own hash, so the lookup costs nothing.
    return hashlib.sha256(text.encode()).hexdigest()


def media_items(generation: Generation, content: bool) -> list[dict]:
    """Each attached item as the trace keeps it: what it was, and where the media tokens it became
    start and how many they are (a video's are spread over its frames, between timestamps)."""
    runs = generation.media_runs
    items = []
    for n, part in enumerate(generation.media_parts):
        info = dict(part.info)
        thumbnail = info.pop("thumbnail", None)
        offset, span, length = runs[n] if n < len(runs) else (None, 0, 0)
        item = {"kind": part.kind, "mime": part.mime, "param": part.param, **info, "tokens": length, "offset": offset}
        if span != length:
            item["span"] = span
        if part.url:
            item["url"] = part.url
        if content and thumbnail:
            item["thumbnail"] = "data:image/jpeg;base64," + base64.b64encode(thumbnail).decode()
        items.append(item)
    return items
