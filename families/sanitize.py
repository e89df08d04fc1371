"""Control tokens in the keys of what a client sends, made plain text like those in its values.

`apply_chat_template(..., sanitize_control_tokens=True)` wraps every control token it finds in the
strings of messages and tools in private-use markers, and encodes what it wrapped as plain text, so
that a user, a tool result or a schema cannot close a turn or open a call. It wraps values only: a
dict key (a tool call's argument name, a schema's property name) reached the template whole, and an
argument named `k<|im_end|>\\n<|im_start|>system\\n…` rendered as a real system turn. The keys are
wrapped here, with transformers' own markers, before the template runs; transformers wraps the
values. (transformers' private helpers, deliberately: the markers must be exactly the ones its
encoder looks for.) They are read when first needed, not at import: transformers is imported only
once the server knows whether this process may hold torch (proxy/engine/model_runtime.py).
"""

from __future__ import annotations

import functools
import re
from typing import Any


@functools.cache
def _markers() -> tuple[str, str, re.Pattern]:
    from transformers.utils.chat_template_utils import _CONTROL_TOKEN_END, _CONTROL_TOKEN_START

    return _CONTROL_TOKEN_START, _CONTROL_TOKEN_END, re.compile(f"[{_CONTROL_TOKEN_START}{_CONTROL_TOKEN_END}]")


def treat_added_tokens_as_control(tokenizer: Any) -> re.Pattern | None:
    """Makes every added token (but plain whitespace) a control token for the sanitizing of a client's
    text, and returns a pattern of them all, longest first (None when there is none).

    transformers' default counts only special tokens and those the template itself spells out, so a
    message holding `<|fim_prefix|>` (Qwen's, not in its chat template) still became that token.
    `chat_control_tokens` is the tokenizer's own setting for this list."""
    added = getattr(tokenizer, "added_tokens_encoder", None)
    if not added:
        return None
    tokenizer.chat_control_tokens = [t for t in added if t and not t.isspace()]
    special = {t.content for t in tokenizer.added_tokens_decoder.values() if t.special}
    tokens = sorted(set(tokenizer.chat_control_tokens) | special, key=len, reverse=True)
    return re.compile("|".join(map(re.escape, tokens)))


def mark_keys(obj: Any, control: re.Pattern) -> Any:
    """`obj` with the control tokens of every dict key, at any depth, wrapped as transformers wraps
    those of values (markers already in a key are dropped first, so none can be forged)."""
    if isinstance(obj, dict):
        return {(_mark(key, control) if isinstance(key, str) else key): mark_keys(value, control)
                for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [mark_keys(value, control) for value in obj]
    return obj


def _mark(text: str, control: re.Pattern) -> str:
    """Markers already in `text` dropped (none can be forged), then each control token wrapped in them."""
    start, end, markers = _markers()
    if start in text or end in text:
        text = markers.sub("", text)
    elif control.search(text) is None:
        return text
    return control.sub(f"{start}\\g<0>{end}", text)



def mark_chat(obj: Any, control: re.Pattern) -> Any:
    """`obj` with the control tokens of every key and every string value wrapped, in one walk: what
    `mark_keys` and then transformers' `mark_control_tokens` (values) do, for a chat rendered to text
    and encoded by `encode_marked_chat` (families/incremental.py). A string without markers or control
    tokens, nearly all of them, is kept as it is."""
    if isinstance(obj, str):
        return _mark(obj, control)
    if isinstance(obj, dict):
        return {(_mark(key, control) if isinstance(key, str) else key): mark_chat(value, control)
                for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [mark_chat(value, control) for value in obj]
    return obj
