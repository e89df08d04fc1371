"""A conversation's template text rendered from what a turn adds, certified against the kept text.

Jinja renders a chat template over every message, so a 126 K-token agent session paid for the whole
conversation every turn even though its text changes only at the end. Here each conversation's last
template text is kept with the messages, tools and settings it was rendered from; the next turn
renders only a small window and splices it onto the kept text.

Why the splice is the template's own text. The templates we serve (Qwen3.5's, Gemma 4's, ChatML's)
write a message from the message itself, its neighbours (tool results grouped with the call, Gemma's
"same model turn" that looks back to the last message that is not a tool's, a call that looks ahead at
its results), the first message (the system prompt), the tools and settings, and where the last user
message is (reasoning kept only after it). So, for a turn whose messages extend the kept ones:

1. the kept messages, tools and settings must be equal to the new request's first ones (compared, not
   hashed: strings compare in C);
2. no new message is one that moves the "last user message" or the system prompt (`rewrites_roles`):
   such a turn rewrites earlier turns (Qwen3.5 drops the reasoning before it) and is rendered whole;
3. the window is the first message (when a system one), a filler user message (the templates want a user
   query; every windowed assistant then lies after the last one, as in the full rendering), then the
   conversation from the assistant message `j` before the last kept one `k`: messages `j..k` are
   context, so that `k` meets the same neighbours it met in the full rendering;
4. the certificate: the window rendered over the kept messages, from `k` on, must be exactly the kept
   text's end, and the context alone must be a prefix of both windows. Then the window rendered
   over the new messages, from `k` on, replaces that end. Rendering from `k` on was shown, on the
   kept turn, to be the full rendering's; messages before `k` meet the same neighbours as before
   (`k` itself is unchanged), so their text stands.

Any check that fails renders the whole conversation, as does every `check_every`-th window, whose
text is compared with a whole rendering: a difference (the declared look-back wrong for a template)
is counted (`drift`), logged, and the whole rendering used. Never a wrong prompt: the tokens are then
encoded as before (incremental.py, its own checks), and token continuity's checks read this text.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Callable

from looptrace.common.byte_bounded import ByteBounded
from looptrace.common.sequences import common_prefix

log = logging.getLogger("looptrace")

FILLER = {"role": "user", "content": "."}
WINDOW, WHOLE, FALLBACK = "window", "whole", "fallback"  # how a turn's text was rendered


@dataclass(slots=True)
class KeptChat:
    messages: list[dict]
    tools: list[dict] | None
    extra: dict
    text: str  # the template's text for `messages`, generation prompt included

    @property
    def size(self) -> int:
        """Bytes held, about: the text, and the messages' strings, about as many again."""
        return 2 * len(self.text) * (1 if self.text.isascii() else 4)


@dataclass(slots=True, frozen=True)
class Windowed:
    """A turn's template text; `how`: WINDOW, WHOLE (nothing kept to start from) or FALLBACK (a check
    refused the window); `checked`: None, or whether a whole rendering done to check it agreed."""

    text: str
    how: str
    checked: bool | None = None


Render = Callable[[list[dict], bool], str]  # (messages, generation prompt) → the template's marked text


class RenderWindows:
    """Each conversation's last template text, within a bound on bytes (least recently used out)."""

    def __init__(self, max_bytes: int, check_every: int = 0, rewrites_roles: frozenset[str] = frozenset()) -> None:
        self.max_bytes = max_bytes
        self.check_every = check_every
        self.rewrites_roles = rewrites_roles
        self.windows = self.checks = self.drift = 0
        self._kept: ByteBounded[KeptChat] = ByteBounded(max_bytes)
        self._lock = threading.Lock()  # the counters'

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def render(self, key: str | None, messages: list[dict], tools: list[dict] | None, extra: dict,
               render: Render) -> Windowed:
        """The template's text for `messages` (generation prompt included), from `key`'s kept text where
        the checks above allow it; `render(messages, generation_prompt)` runs the template."""
        kept = self._get(key)
        text = self._windowed(kept, messages, tools, extra, render) if kept is not None else None
        if text is None:
            whole = render(messages, True)
            result = Windowed(whole, WHOLE if kept is None else FALLBACK)
        else:
            result = Windowed(text, WINDOW)
            if self.check_every and self._due():
                result = self._checked(key, result, render(messages, True))
        self._put(key, KeptChat(list(messages), tools, dict(extra), result.text))
        return result

    def _windowed(self, kept: KeptChat, messages: list[dict], tools: list[dict] | None, extra: dict,
                  render: Render) -> str | None:
        p = len(kept.messages)
        if len(messages) <= p or kept.tools != tools or kept.extra != extra or messages[:p] != kept.messages:
            return None
        if any(m.get("role") in self.rewrites_roles for m in messages[p:]):
            return None
        assistants = [i for i in range(p - 1, 0, -1) if messages[i].get("role") == "assistant"][:2]
        if len(assistants) < 2:
            return None
        k, j = assistants
        head = [messages[0]] if messages[0].get("role") in ("system", "developer") else []
        if j < len(head):
            return None
        start = [*head, FILLER, *messages[j:k]]
        try:
            context = render(start, False)
            old = render([*start, *messages[k:p]], True)
            new = render([*start, *messages[k:]], True)
        except Exception:  # noqa: BLE001 - a window the template refuses proves nothing: rendered whole
            return None
        if not (old.startswith(context) and new.startswith(context)):
            return None
        old_tail = old[len(context):]
        if len(old_tail) >= len(kept.text) or not kept.text.endswith(old_tail):
            return None  # the certificate: the window does not write the kept turns as the whole rendering did
        return kept.text[:len(kept.text) - len(old_tail)] + new[len(context):]

    def _checked(self, key: str | None, result: Windowed, whole: str) -> Windowed:
        same = whole == result.text
        with self._lock:
            self.checks += 1
            self.drift += not same
        if same:
            return Windowed(result.text, WINDOW, True)
        log.warning("the windowed rendering of conversation %r differed from a whole rendering at character %d "
                    "of %d: the whole rendering is used", key, common_prefix(whole, result.text), len(whole))
        return Windowed(whole, FALLBACK, False)

    def _due(self) -> bool:
        with self._lock:
            self.windows += 1
            return self.windows % self.check_every == 0

    def _get(self, key: str | None) -> KeptChat | None:
        return self._kept.get(key) if key is not None else None

    def _put(self, key: str | None, chat: KeptChat) -> None:
        if key is not None:
            self._kept.put(key, chat, chat.size)
