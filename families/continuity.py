"""Token continuity, the family's part: a turn's prompt built of the ids the model read and sampled on
the turn before, then the template's rendering of only what follows the answer, where that is provably
a splice of what the template renders now; and, at load, whether the template keeps what it wrote of a
conversation when the conversation goes on (prefix preservation).

A harness sends its whole conversation again each turn, the model's answers as text, and the template
renders them again: Qwen3.5's drops an earlier answer's reasoning once a new user message comes,
Gemma 4's leaves out the empty thought channel its generation prompt opened, and the same text can
tokenize otherwise than the model wrote it. Token continuity (proxy/engine/continuity.py) keeps what
the model read and wrote, as ids, and appends the template's rendering from the turn-end marker that
closes the answer (`Family.turn_end_tokens`): an added token, where a fast tokenizer splits its input
first (incremental.py), so the ids after it are the ids a whole encoding gives.

Where the answer ends is found by rendering, not by counting. Beside the conversation as the template
writes it now, the template renders a probe: a user message, then the answer and every later message,
each of their texts (and the answer's reasoning and calls' names) ending with a mark, a random word.
In the probe, the marker that closes the answer is the first one after the answer's marks; every later
message's mark must lie past it (Gemma 4 writes a call's result inside the model's turn, before the
turn's text: then no cut separates the answer from what follows). What the probe writes from there,
its marks taken out, must be exactly how the conversation's rendering ends, from the marker as many
markers before its end: then the rendering's tail is the template's writing of what follows the
answer and nothing else (a later message written elsewhere, a system message moved first, would not
match), and the turns the rendering closes before it must be as many as the kept prompt closed (a
tools block or system turn that came or went would not line up). An answer the template writes
nothing of (SmolLM2's writes a call-only answer as an empty turn) is given a place by a second probe,
its empty text a mark, which must change nothing else the probe writes. The probe is a few messages long,
whatever the conversation's length. The engine checks the rest before asking: the same messages, tools
and settings, and the model's own answer.
"""

from __future__ import annotations

import secrets
from bisect import bisect_left
from typing import Any

from jinja2 import TemplateError

from .base import Family, Rendered, RenderError, merge_system_messages, token_id
from .incremental import HEAD_CHARS, Encoding

CONTEXT_IDS = 4  # ids before new text decoded with it, so that it decodes as it does in place


def turn_end_ids(family: Family) -> frozenset[int]:
    tok = family._tokenizer_itself()
    return frozenset(i for i in (token_id(tok, t) for t in family.turn_end_tokens) if i is not None)


def turns_closed(family: Family, prompt_ids: list[int]) -> int:
    """How many turn-end markers a prompt holds: the turns the template closed before its end."""
    return sum(prompt_ids.count(i) for i in turn_end_ids(family))


def continued(family: Family, messages: list[dict], answer_at: int, tools: list[dict] | None,
              enable_thinking: bool | None, prompt: list[int], sampled: list[int], *, conversation: str | None,
              encoding: int, salt: str | None = None) -> tuple[Rendered, bool]:
    """The turn's prompt of text alone, and whether it is spliced: `prompt` (the last turn's, which
    `encoding` encoded) + `sampled` + the template's rendering of what follows `messages[answer_at]`
    (the model's answer), where the splice is proven (above); else rendered as always (`Family.render`).
    `salt`: the tenant's, as `Family.render` takes it. Raises RenderError as `Family.render` does."""
    if family._control is None:  # no added tokens to cut at
        return family.render(messages, tools, enable_thinking, media=False, conversation=conversation, salt=salt), False
    extra = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    try:
        marked = _marked_chat(family, messages, tools, extra, conversation)
    except TemplateError as exc:
        raise RenderError(exc.message or str(exc)) from exc
    except (ValueError, RecursionError) as exc:
        raise RenderError(str(exc) or "the chat template refused the conversation") from exc
    cut = answer_end(family, marked, messages, answer_at, tools, extra, turns_closed(family, prompt))
    if cut is None:
        return family.render(messages, tools, enable_thinking, media=False, conversation=conversation, salt=salt), False
    return _spliced(family, conversation, prompt, sampled, encoding, marked[cut:], marked[:HEAD_CHARS], salt), True


def answer_end(family: Family, marked: str, messages: list[dict], answer_at: int, tools: list[dict] | None,
               extra: dict, closed: int) -> int | None:
    """Where the marker that closes `messages[answer_at]` starts in `marked` (`messages` as the template
    writes them), proven by a probe (above); None where it is not."""
    probe_messages, answer_marks, later_marks = _probe(messages, answer_at, secrets.token_hex(8))
    try:
        probe = _marked_chat(family, probe_messages, tools, extra)
    except (TemplateError, ValueError, RecursionError, TypeError):
        return None  # a template that refuses the probe proves nothing
    found = [at for at in (probe.find(mark) for mark in answer_marks) if at >= 0]
    if not found:  # the template writes nothing of the answer (SmolLM2's: a call-only one): give it a place
        probe, filler = _filled(family, probe, probe_messages, tools, extra, secrets.token_hex(8))
        if filler is None:
            return None
        answer_marks, found = [filler], [probe.find(filler)]
    probe_ends = markers(family, probe)
    k = bisect_left(probe_ends, max(found))  # the first marker after the answer's marks closes it
    if k == 0 or k >= len(probe_ends) or min(found) < probe_ends[k - 1]:
        return None  # no marker closes it, or it is not one turn
    cut = probe_ends[k]
    if any(0 <= probe.find(mark) < cut for mark in later_marks):
        return None  # a later message is written before the answer's end
    tail = probe[cut:]
    for mark in answer_marks + later_marks:
        tail = tail.replace(mark, "")
    ends = markers(family, marked)
    at = len(ends) - (len(probe_ends) - k)  # as many markers before the rendering's end as the probe's tail holds
    if at != closed or at < 0 or not marked.endswith(tail) or len(marked) - len(tail) != ends[at]:
        return None  # the turns before the answer do not line up with the kept prompt's, or the tails differ
    return ends[at]


def _filled(family: Family, probe: str, probe_messages: list[dict], tools: list[dict] | None, extra: dict,
            nonce: str) -> tuple[str, str | None]:
    """The probe again, the answer's empty text a mark: proof of where the template writes the answer,
    if that is all it changes (a template that writes an empty turn otherwise, or not at all, differs
    elsewhere). (probe, None) where it is not."""
    filler = f"LOOPTRACE{nonce}E"
    content = probe_messages[1].get("content")
    if content not in (None, ""):
        return probe, None  # text the template chose not to write: no place to give it
    filled = [probe_messages[0], {**probe_messages[1], "content": filler}, *probe_messages[2:]]
    try:
        again = _marked_chat(family, filled, tools, extra)
    except (TemplateError, ValueError, RecursionError, TypeError):
        return probe, None
    if again.count(filler) != 1 or again.replace(filler, "") != probe:
        return probe, None
    return again, filler


PROBE_ASK = {"role": "user", "content": "."}  # what the probe's answer follows: a template wants a user turn first


def _probe(messages: list[dict], answer_at: int, nonce: str) -> tuple[list[dict], list[str], list[str]]:
    """A user message, then `messages[answer_at:]`, with a mark ending each of the answer's fields (its
    text, reasoning, calls' names) and each later message's text; and the marks of each. Marks are
    letters and digits, which no template escapes, placed before a text's trailing whitespace (which a
    template may trim); a field empty or blank stays so (a template may write a turn otherwise without one)."""
    count = iter(range(1 << 30))

    def mark() -> str:
        return f"LOOPTRACE{nonce}N{next(count)}Z"

    answer = dict(messages[answer_at])
    answer_marks: list[str] = []
    for key in ("content", "reasoning_content"):
        if key in answer:
            answer[key] = _marked_text(answer[key], mark, answer_marks)
    calls = []
    for call in answer.get("tool_calls") or ():
        function = dict(call.get("function") or {}) if isinstance(call, dict) else {}
        if isinstance(function.get("name"), str):
            answer_marks.append(mark())
            function["name"] += answer_marks[-1]
        calls.append({**call, "function": function} if isinstance(call, dict) else call)
    if calls:
        answer["tool_calls"] = calls
    later_marks: list[str] = []
    later = [{**m, "content": _marked_text(m["content"], mark, later_marks)} if "content" in m else m
             for m in messages[answer_at + 1:]]
    return [dict(PROBE_ASK), answer, *later], answer_marks, later_marks


def _marked_text(content: Any, mark, marks: list[str]) -> Any:
    if isinstance(content, str) and content.strip():
        marks.append(mark())
        text = content.rstrip()
        return text + marks[-1] + content[len(text):]
    if isinstance(content, list):
        texts = [n for n, p in enumerate(content)
                 if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                 and p["text"].strip()]
        if texts:
            content = list(content)
            content[texts[-1]] = {**content[texts[-1]], "text": _marked_text(content[texts[-1]]["text"], mark, marks)}
    return content


def _marked_chat(family: Family, messages: list[dict], tools: list[dict] | None, extra: dict,
                 conversation: str | None = None) -> str:
    """The conversation as `Family.render` renders a chat of text alone, before encoding (from what the
    turn adds, for a conversation's: render_windows.py)."""
    if family.system_first_only:
        messages, _ = merge_system_messages(messages)
    return family.conversation_chat(messages, tools, extra, conversation).text


def _spliced(family: Family, conversation: str | None, prompt: list[int], sampled: list[int], encoding: int,
             tail_text: str, head: str, salt: str | None) -> Rendered:
    """prompt + sampled + `tail_text` (the template's text from the marker that closes the answer)
    encoded; the marker is the model's own where it sampled it. Kept as the conversation's encoding, so
    that the next turn reads its text and ids rather than decoding them."""
    tail = family.encoder.encode_marked(tail_text)
    added = tail[1:] if sampled and tail and sampled[-1] == tail[0] else tail
    ids = prompt + sampled + added
    kept = _previous_encoding(family, conversation, encoding, len(prompt), salt)
    before = kept.text if kept is not None else family.encoder.decode_pieces([prompt])[0]
    base = kept.serial if kept is not None else 0
    context = prompt[-CONTEXT_IDS:]
    lead, text = family.encoder.decode_pieces([context, context + sampled + added])
    text = before + (text[len(lead):] if text.startswith(lead) else family.encoder.decode_pieces([sampled + added])[0])
    serial = family.encoder.keep(conversation, head, ids, text, base=kept, salt=salt)
    return Rendered(text=text, ids=ids, thinking=family.prompt_leaves_thinking(text),
                    history_length=len(ids) - family.transient_tail_length(text, ids), encoding=serial,
                    reused_from=base, reused_ids=len(prompt) if base else 0, reused_chars=len(before) if base else 0)


def _previous_encoding(family: Family, conversation: str | None, encoding: int, length: int,
                       salt: str | None) -> Encoding | None:
    """The encoding this process kept of the previous prompt (its text and ids); None where another
    process served it (then its text is decoded from its ids)."""
    kept = family.encoder.kept.get(conversation, "", salt) if conversation else None
    if kept is not None and encoding and kept.serial == encoding and len(kept.ids) == length:
        return kept
    return None


def markers(family: Family, marked: str) -> list[int]:
    """Where each turn-end marker the template wrote starts in `marked`, in order (a client's marker,
    wrapped in transformers' markers, is not one)."""
    from transformers.utils.chat_template_utils import _CONTROL_TOKEN_END, _CONTROL_TOKEN_START

    found: list[int] = []
    for token in family.turn_end_tokens:
        at = marked.find(token)
        while at >= 0:
            end = at + len(token)
            wrapped = at > 0 and marked[at - 1] == _CONTROL_TOKEN_START and marked[end:end + 1] == _CONTROL_TOKEN_END
            if not wrapped:
                found.append(at)
            at = marked.find(token, end)
    found.sort()
    return found


# -- at load: does the template keep what it wrote? --

TOOL = {"type": "function", "function": {"name": "read_file", "description": "Read a file.", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}


def _script(images: bool, thinking: bool) -> list[tuple[str, list[dict]]]:
    """An agent's session as turns: (what the turn adds, the conversation up to its prompt); the
    answers hold reasoning with thinking on."""
    call = {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": {"path": "notes.txt"}}}
    system = {"role": "system", "content": "You are a coding agent."}
    ask = {"role": "user", "content": "Read notes.txt."}
    called = {"role": "assistant", "content": "", "reasoning_content": "I should read it.", "tool_calls": [call]}
    result = {"role": "tool", "tool_call_id": "call_1", "content": "hello"}
    answered = {"role": "assistant", "content": "It says hello.", "reasoning_content": "It says hello."}
    follow = {"role": "user", "content": [{"type": "text", "text": "And this picture?"}, {"type": "image"}]} \
        if images else {"role": "user", "content": "And now?"}
    last = {"role": "assistant", "content": "A cat.", "reasoning_content": "Looking at it."}
    thanks = {"role": "user", "content": "Thanks."}
    if not thinking:
        for answer in (called, answered, last):
            del answer["reasoning_content"]
    first = [system, ask]
    return [("a tool call and its result", [*first, called, result]),
            ("an answer after a tool result, then a new user message" + (" with an image" if images else ""),
             [*first, called, result, answered, follow]),
            ("an answer, then a new user message", [*first, called, result, answered, follow, last, thanks])]


def template_report(family: Family) -> dict:
    """Renders a scripted agent session (a tool call with reasoning, its result, answers, new user
    messages, an image where the family reads them) turn by turn, with thinking on and off, and says
    where the template does not keep what it wrote: the previous prompt (`prompt_kept`) or the answer
    as it rendered it right after that prompt (`answer_kept`)."""
    rewrites: list[str] = []
    turns = []
    for thinking in (True, False):
        extra = {"enable_thinking": thinking}
        script = _script(bool(family.media_kinds), thinking)
        before = _marked(family, script[0][1][:2], extra, True)
        for name, messages in script:
            answer_at = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
            prompt = _marked(family, messages, extra, True)
            head = _marked(family, messages[:answer_at + 1], extra, False)
            ends = markers(family, head)
            closed = len(markers(family, before))  # the answer's end: the marker after the prompt's
            answer = head[:_after_marker(family, head, ends[closed])] if closed < len(ends) else head
            kept = {"turn": name, "thinking": thinking, "prompt_kept": prompt.startswith(before),
                    "answer_kept": prompt.startswith(answer)}
            turns.append(kept)
            for key, what in (("prompt_kept", "the previous prompt is rewritten"),
                              ("answer_kept", "the answer is rewritten")):
                if not kept[key]:
                    rewrites.append(f"thinking {'on' if thinking else 'off'}, {name}: {what}")
            before = prompt
    return {"prefix_preserving": not rewrites, "rewrites": rewrites, "turns": turns}


def _after_marker(family: Family, marked: str, at: int) -> int:
    return at + next(len(t) for t in family.turn_end_tokens if marked.startswith(t, at))


def _marked(family: Family, messages: list[dict], extra: dict, generation_prompt: bool) -> str:
    if family.system_first_only:
        messages, _ = merge_system_messages(messages)
    try:
        return family.marked_chat(messages, [TOOL], extra, generation_prompt)
    except (TemplateError, ValueError, TypeError) as exc:
        raise ValueError(f"the template refused the scripted session: {exc}") from exc


def report_line(family: Family, report: dict[str, Any]) -> str:
    if report["prefix_preserving"]:
        return f"{family.name} template: keeps every earlier turn as it wrote it (prefix preserving)"
    return f"{family.name} template rewrites earlier turns: " + "; ".join(report["rewrites"])
