"""What a request's spans record of its text, written apart from the spans themselves (request_spans.py
assigns these as its methods): the conversation in the GenAI conventions' shape, and credentials in
what is recorded replaced by markers (common/redaction.py) — in prompts, their ids, messages, tool
results and the model's own tokens. `spans` is the RequestSpans."""

from __future__ import annotations

from looptrace.common import attributes as attr
from looptrace.common.jsonio import dumps
from looptrace.common.token_event import TOP_N

from ..engine.generation import Generation
from . import genai, openinference
from .redacted_ids import redacted_ids


def redact_prompt(spans, attributes: dict, tokenizer, results: list[dict]) -> None:
    """The prompt's text as the render span keeps it, credentials replaced by markers of the same
    length (so every offset kept into it holds: its stored cut, the part new this turn), and the ids
    of a text that held one re-encoded from the redacted text, to the same count: they decode to the
    markers, not the secret, and the step says so (`looptrace.redacted`), for exports to mask it.
    What is redacted is what this turn stores: the part it adds, the whole only where kept whole."""
    redact = spans.redactor.redact
    done: list[tuple[str, str]] = []  # (text, redacted): the part new this turn ends the prompt, read once
    for text_key, ids_key in ((attr.PROMPT_TEXT, attr.PROMPT_IDS), (attr.PROMPT_ADDED_TEXT, attr.PROMPT_ADDED_IDS),
                              (attr.PROMPT_NEW_TEXT, None), (attr.PROMPT_FORCED_PREFIX, None)):
        text = attributes.get(text_key)
        if not text:
            continue
        whole = next(((t, r) for t, r in done if t.endswith(text)), None) if ids_key is None else None
        if whole is not None:  # markers keep length: the end of the redacted whole is this part redacted
            attributes[text_key] = whole[1][len(whole[0]) - len(text):]
            continue
        redacted, found = redact(text, keep_length=True)
        done.append((text, redacted))
        if not found:
            continue
        attributes[text_key] = redacted
        spans._redacted += len(found)
        if ids_key is not None and ids_key in attributes:
            attributes[ids_key] = redacted_ids(tokenizer, attributes[ids_key], text, redacted, found)
    if attr.PROMPT_MEDIA in attributes:  # a URL's user:password@
        attributes[attr.PROMPT_MEDIA] = spans._text(attributes[attr.PROMPT_MEDIA])
    for result in results:
        if attr.TOOL_RESULT in result:
            result[attr.TOOL_RESULT] = spans._text(result[attr.TOOL_RESULT])
    if spans._redacted:
        attributes[attr.REDACTED] = spans._redacted


def redact_tokens(spans) -> int:
    """A credential the model wrote, in the decode span's token events: the answer's text is searched
    once, at its end (a secret may span groups), and each token overlapping one gets the marker's
    characters for its text and piece, the id of `*`, and no candidates. Each group's arrays are the
    ones its event holds (span_arrays.add_event keeps them, not a copy), changed before the span ends and is
    seen by any processor. Returns how many were found."""
    groups, spans._groups = spans._groups, []
    if not groups:
        return 0
    texts = [text for group in groups for text in group[attr.TOKENS_TEXT]]
    whole = "".join(texts)
    found = spans.redactor.find(whole)
    if not found:
        return 0
    redacted = spans.redactor.replace(whole, found, keep_length=True)
    star = (spans._tokenizer.encode("*", add_special_tokens=False) or [0])[0]
    at, f = 0, 0
    for group in groups:
        for i, text in enumerate(group[attr.TOKENS_TEXT]):
            start, end = at, at + len(text)
            at = end
            while f < len(found) and found[f].end <= start:
                f += 1
            if f < len(found) and found[f].start < end:
                group[attr.TOKENS_TEXT][i] = group[attr.TOKENS_PIECE][i] = redacted[start:end]
                group[attr.TOKENS_ID][i] = star
                top = slice(i * TOP_N, (i + 1) * TOP_N)
                group[attr.TOKENS_TOP_IDS][top] = [-1] * TOP_N
                group[attr.TOKENS_TOP_PIECES][top] = [""] * TOP_N
    spans._redacted += len(found)
    return len(found)


def text(spans, text):
    """`text` as recorded: credentials replaced by markers (None and "" as they are)."""
    if not text or spans.redactor is None:
        return text
    redacted, found = spans.redactor.redact(text)
    spans._redacted += len(found)
    return redacted


def record_messages(spans, generation: Generation) -> None:
    """The conversation in the GenAI conventions' shape (genai.py), and which messages are new
    since the conversation's last request: what a person reads as this step of the loop. Each
    message is encoded once; its JSON is also its digest for finding what is new."""
    request = generation.request
    messages = [dumps(genai.message(m)) for m in request.messages]
    instructions, lead = genai.system_instructions(request.messages)
    new_from, base = spans.turn.new_messages_from(messages) if spans.conversation else (0, None)
    new_messages = spans._text("[" + ",".join(messages[new_from:]) + "]")
    attributes = {attr.INPUT_NEW_FROM: new_from, attr.INPUT_NEW_MESSAGES: new_messages}
    continues = base and new_from > lead
    if continues:  # the same system messages lead both: stored as what it adds (chains.py)
        attributes.update({attr.INPUT_BASE_TRACE_ID: base, attr.INPUT_BASE_MESSAGES: new_from - lead})
    if not continues or spans.exported:  # exported whole; the store leaves it out (chains.compacted)
        attributes[attr.GEN_AI_INPUT_MESSAGES] = new_messages if new_from == lead else \
            spans._text("[" + ",".join(messages[lead:]) + "]")  # the same list is redacted once
    if spans.exported:
        attributes.update(openinference.turn_input(request.messages))
        attributes[attr.INPUT_VALUE] = spans._text(attributes[attr.INPUT_VALUE])
    if instructions:
        attributes[attr.GEN_AI_SYSTEM_INSTRUCTIONS] = spans._text(dumps(instructions))
    if request.tools:
        attributes[attr.GEN_AI_TOOL_DEFINITIONS] = spans._text(dumps(genai.tool_definitions(request.tools)))
    spans.span.set_attributes(attributes)

