"""Claude Code's context management (`context_management.edits`, the context-management-2025-06-27
beta), applied to what is rendered, as Anthropic applies it before a prompt reaches its model. The
client keeps its whole history and each request is edited afresh, so an edit is a function of the
history alone: two turns of one conversation are edited alike up to where the later one goes on.

- clear_thinking_20251015: the thinking of every assistant turn but the latest `keep` that have any
  is dropped (1 by default; "all" keeps all). Templates that drop old thinking themselves (Qwen3.5's,
  before the last user message) render the same either way.
- clear_tool_uses_20250919: once the prompt passes `trigger` (input tokens, 100,000 by default, or a
  count of tool uses), every tool result but the latest `keep` (3 by default) and those of
  `exclude_tools` is replaced by PLACEHOLDER; with `clear_tool_inputs` (true, or a list of tools'
  names) the call's input is emptied too. With `clear_at_least`, nothing is cleared unless that many
  input tokens would go.
- An edit of another type is ignored (a newer client's), never refused.

What each edit cleared is answered as Anthropic answers it: `context_management.applied_edits`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from ..request_parts import warn_once
from .protocol import ClearThinking, ClearToolUses, ContextManagement

PLACEHOLDER = "[This tool result was cleared to save context.]"
DEFAULT_TRIGGER_TOKENS = 100_000
DEFAULT_KEEP_TOOL_USES = 3
DEFAULT_KEEP_THINKING_TURNS = 1

Count = Callable[[str], int]  # a text's tokens, with the model's tokenizer

# The messages edited are the engine's, as content.py writes them: every one has its role and content,
# a tool's its tool_call_id, a call its id, name and arguments; tool_calls and reasoning_content are
# there only when the turn has them.


@dataclass(slots=True)
class Edited:
    messages: list[dict]
    applied: list[dict] = field(default_factory=list)  # the response's context_management.applied_edits


def needs_prompt_tokens(management: ContextManagement | None, body_bytes: int | None) -> bool:
    """Whether an edit waits on the prompt's token count: a clear_tool_uses triggered by input tokens,
    unless the body is too short to reach it (a token is at least a byte of the body's JSON, which also
    outweighs the template's framing of each message; 1,024 tokens spare for what a template adds)."""
    for edit in _edits(management):
        if type(edit) is ClearToolUses and (edit.trigger is None or edit.trigger.type == "input_tokens"):
            trigger = edit.trigger.value if edit.trigger is not None else DEFAULT_TRIGGER_TOKENS
            if body_bytes is None or body_bytes + 1024 > trigger:
                return True
    return False


def apply(management: ContextManagement | None, messages: list[dict], count: Count,
          prompt_tokens: int | None = None) -> Edited:
    """`messages` (the engine's) edited; `prompt_tokens`: the unedited prompt's, where
    needs_prompt_tokens said it is needed (None: known to be under every input-token trigger)."""
    out = Edited(messages)
    for edit in _edits(management):
        kind = type(edit)
        if kind is ClearThinking:
            out.messages, applied = _clear_thinking(out.messages, edit, count)
        elif kind is ClearToolUses:
            out.messages, applied = _clear_tool_uses(out.messages, edit, count, prompt_tokens)
        else:
            warn_once(f"context-edit-{edit.type[:64]}", "context_management edit %r is not known here: ignored "
                      "(said once)", edit.type[:64])
            continue
        out.applied.append(applied)
    return out


def _edits(management: ContextManagement | None) -> list:
    return list(management.edits or ()) if management is not None else []


def _clear_thinking(messages: list[dict], edit: ClearThinking, count: Count) -> tuple[list[dict], dict]:
    applied = {"type": edit.type, "cleared_thinking_turns": 0, "cleared_input_tokens": 0}
    if edit.keep == "all":
        return messages, applied
    keep = edit.keep.value if edit.keep is not None else DEFAULT_KEEP_THINKING_TURNS
    thinking = [i for i, m in enumerate(messages) if m["role"] == "assistant"
                and "reasoning_content" in m and m["reasoning_content"]]
    cleared = thinking[:max(len(thinking) - keep, 0)]
    if not cleared:
        return messages, applied
    out = list(messages)
    for i in cleared:
        applied["cleared_input_tokens"] += count(out[i]["reasoning_content"])
        out[i] = {k: v for k, v in out[i].items() if k != "reasoning_content"}
    applied["cleared_thinking_turns"] = len(cleared)
    return out, applied


def _clear_tool_uses(messages: list[dict], edit: ClearToolUses, count: Count,
                     prompt_tokens: int | None) -> tuple[list[dict], dict]:
    applied = {"type": edit.type, "cleared_tool_uses": 0, "cleared_input_tokens": 0}
    calls = {}  # a call's id → (its assistant message's index, its place in that message's calls, its name)
    for i, message in enumerate(messages):
        for j, call in enumerate(message["tool_calls"] if "tool_calls" in message else ()):
            calls[call["id"]] = (i, j, call["function"]["name"])
    results = [i for i, m in enumerate(messages) if m["role"] == "tool"]
    if not _triggered(edit, len(results), prompt_tokens):
        return messages, applied
    keep = edit.keep.value if edit.keep is not None else DEFAULT_KEEP_TOOL_USES
    excluded = set(edit.exclude_tools or ())
    inputs = edit.clear_tool_inputs
    clearable = [i for i in results if calls.get(messages[i]["tool_call_id"], (0, 0, None))[2] not in excluded]
    cleared = clearable[:max(len(clearable) - keep, 0)]
    out, tokens = list(messages), 0
    for i in cleared:
        tokens += _tokens(out[i]["content"], count)
        out[i] = {**out[i], "content": PLACEHOLDER}
        place = calls.get(out[i]["tool_call_id"])
        if place is not None and (inputs is True or (isinstance(inputs, list) and place[2] in inputs)):
            tokens += _empty_input(out, place, count)
    least = edit.clear_at_least.value if edit.clear_at_least is not None else 0
    if not cleared or tokens < least:
        return messages, applied
    applied["cleared_tool_uses"], applied["cleared_input_tokens"] = len(cleared), tokens
    return out, applied


def _triggered(edit: ClearToolUses, tool_uses: int, prompt_tokens: int | None) -> bool:
    if edit.trigger is not None and edit.trigger.type == "tool_uses":
        return tool_uses > edit.trigger.value
    trigger = edit.trigger.value if edit.trigger is not None else DEFAULT_TRIGGER_TOKENS
    return prompt_tokens is not None and prompt_tokens > trigger


def _empty_input(messages: list[dict], place: tuple[int, int, str], count: Count) -> int:
    """The call's input emptied ({}), in a copy of its message; the tokens it held."""
    i, j, _ = place
    message = messages[i]
    calls = list(message["tool_calls"])
    function = calls[j]["function"]
    arguments = function["arguments"]
    calls[j] = {**calls[j], "function": {**function, "arguments": {}}}
    messages[i] = {**message, "tool_calls": calls}
    return count(arguments if isinstance(arguments, str) else json.dumps(arguments or {}))


def _tokens(content: object, count: Count) -> int:
    """A tool result's text tokens (an attachment in it counts none: what it held is not text)."""
    if isinstance(content, str):
        return count(content)
    return sum(count(p["text"]) for p in content or () if p["type"] == "text")  # the engine's parts


def counter(tokenizer: object) -> Count:
    """A text's tokens with the served model's tokenizer (a processor's own tokenizer for media models)."""
    tok = getattr(tokenizer, "tokenizer", None)
    encode = (tok if hasattr(tok, "encode") else tokenizer).encode
    return lambda text: len(encode(text, add_special_tokens=False)) if text else 0
