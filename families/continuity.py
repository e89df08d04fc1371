"""Token continuity, the family's part: where the model's last answer ends in the template's rendering
of the conversation that carries it, and what the template writes after it; and, at load, whether the
template keeps what it wrote of a conversation when the conversation goes on (prefix preservation).

A harness sends its whole conversation again each turn, the model's answers as text, and the template
renders them again: Qwen3.5's drops an earlier answer's reasoning once a new user message comes,
Gemma 4's leaves out the empty thought channel its generation prompt opened, and the same text can
tokenize otherwise than the model wrote it. Token continuity (proxy/engine/continuity.py) keeps what
the model read and wrote, as ids, and appends only the template's rendering of what came after the
answer: cut at the turn-end marker that closes the answer (`Family.turn_end_tokens`), an added token,
where a fast tokenizer splits its input first (incremental.py), so the ids after it are the ids a
whole encoding gives.

Where the answer ends: the template writes one turn-end marker per closed turn, and a client's text
cannot hold one (sanitized, it is encoded as text), so the previous prompt holds as many marker ids as
the turns before the answer, and the answer's end is the next marker the template writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jinja2 import TemplateError

from .base import Family, RenderError, merge_system_messages, token_id
from .incremental import HEAD_CHARS


@dataclass(frozen=True, slots=True)
class Tail:
    """What the template writes from the turn-end marker that closes the answer: the marker's id and
    the ids from it on (the marker first)."""

    marker: int
    ids: list[int]


def turn_end_ids(family: Family) -> frozenset[int]:
    tok = family._tokenizer_itself()
    return frozenset(i for i in (token_id(tok, t) for t in family.turn_end_tokens) if i is not None)


def turns_closed(family: Family, prompt_ids: list[int]) -> int:
    """How many turn-end markers a prompt holds: the turns the template closed before its end."""
    return sum(prompt_ids.count(i) for i in turn_end_ids(family))


def tail_after(family: Family, marked: str, closed: int) -> Tail | None:
    """The ids of `marked` (a whole conversation, as `Family.marked_chat` writes it) from the turn-end
    marker after the first `closed` ones: the marker that closes the answer. None when the template
    writes no such marker."""
    found = markers(family, marked)
    if closed >= len(found):
        return None
    ids = family.encoder.encode_marked(marked[found[closed]:])
    return Tail(ids[0], ids) if ids else None


def kept_tail(family: Family, messages: list[dict], tools: list[dict] | None, enable_thinking: bool | None,
              closed: int) -> tuple[Tail, str] | None:
    """The template's rendering of a conversation of text alone (as `Family.render` renders it) from the
    marker that closes the answer after `closed` turns, and the rendering's opening (HEAD_CHARS: what
    a request without a conversation is kept by). None where the template writes no such marker, or
    the family has no added tokens to cut at. Raises RenderError as `Family.render` does."""
    if family._control is None:
        return None
    extra = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    if family.system_first_only:
        messages, _ = merge_system_messages(messages)
    try:
        marked = family.marked_chat(messages, tools, extra)
    except TemplateError as exc:
        raise RenderError(exc.message or str(exc)) from exc
    except (ValueError, RecursionError) as exc:
        raise RenderError(str(exc) or "the chat template refused the conversation") from exc
    tail = tail_after(family, marked, closed)
    return (tail, marked[:HEAD_CHARS]) if tail is not None else None


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
