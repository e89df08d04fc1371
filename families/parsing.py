"""The machinery every family parser shares: marker scanning with hold-back, channels, tool-call capture.

Generated text arrives in pieces split anywhere, so a marker such as `<tool_call>` may come as `<to` +
`ol_call>`. The parser holds back only a suffix that could still become a marker and emits the rest
at once; a tool call is captured whole by a `CallBuilder` and emitted once it has closed.
"""

from __future__ import annotations

import json
import re

from .base import CONTENT, THOUGHT, TOOL_CALL, Parser, new_id
from .deltas import Delta, ToolCallDelta, text_delta, thinking_delta, tool_call_delta, unparsed_call_delta
from .tool_schema import check_arguments, index_tools

# CallBuilder.advance() results.
NEED, DONE, BAD = 0, 1, 2

_NAME_MAX = 64  # a channel name (`thought`) is a word; more text before a newline is thinking


class Markers:
    """A fixed set of marker strings: find the first one, and how much of a tail to hold back."""

    __slots__ = ("regex", "prefixes", "longest")

    def __init__(self, *markers: str) -> None:
        # Longest first, so a marker that is a prefix of another never wins over it.
        ordered = sorted(markers, key=len, reverse=True)
        self.regex = re.compile("|".join(re.escape(m) for m in ordered))
        self.prefixes = frozenset(m[:k] for m in markers for k in range(1, len(m)))
        self.longest = max(len(m) for m in markers)

    def search(self, text: str, pos: int = 0) -> re.Match | None:
        return self.regex.search(text, pos)

    def holdback(self, text: str) -> int:
        """Where the suffix of `text` that could begin a marker starts (len(text) if none)."""
        n = len(text)
        i = text.find("<", max(0, n - self.longest + 1))
        while i != -1:
            if text[i:] in self.prefixes:
                return i
            i = text.find("<", i + 1)
        return n


def expect_one(raw: str, pos: int, options: tuple[str, ...]) -> tuple[int, int, int]:
    """Match one of `options` at raw[pos:] after optional whitespace.

    Returns (DONE, which, end), (NEED, -1, pos) while the text so far could still match, or
    (BAD, -1, start) with `start` where the literal should have begun, so a new marker there
    (a second opener, say) is scanned again rather than swallowed.
    """
    n = len(raw)
    while pos < n and raw[pos].isspace():
        pos += 1
    rest = raw[pos:]
    for k, lit in enumerate(options):
        if rest.startswith(lit):
            return DONE, k, pos + len(lit)
    if any(lit.startswith(rest) for lit in options):
        return NEED, -1, pos
    return BAD, -1, pos


def expect_exact(raw: str, pos: int, literal: str) -> int:
    """DONE if raw[pos:] starts with `literal`, NEED while it may still, else BAD."""
    rest = raw[pos : pos + len(literal)]
    if rest == literal:
        return DONE
    return NEED if literal.startswith(rest) else BAD


class CallBuilder:
    """Captures one tool call's markup, opener included, and finds where it ends.

    `advance()` looks at `raw` (the parser appends to it) and returns NEED, DONE (the call ends at
    `end`) or BAD (`raw[:end]` cannot be a call; what follows is ordinary text again).
    `parse()` turns a DONE call into (name, arguments, arguments_are_text) or raises ValueError.
    """

    __slots__ = ("raw", "end")

    def __init__(self, opener: str) -> None:
        self.raw = opener
        self.end = 0

    def advance(self, final: bool = False) -> int:
        """`final`: the output has ended, nothing more will come."""
        raise NotImplementedError

    def parse(self) -> tuple[str, dict, bool]:
        raise NotImplementedError

    def _fail(self, at: int) -> int:
        self.end = at
        return BAD


class StreamParser(Parser):
    """Thinking/content channels separated by markers, and tool calls captured by a CallBuilder.

    Subclasses set `markers` (per channel), `think_close` and implement `_marker` and `_new_call`.
    Segment starts (the first text of a channel, and text after a tool call) drop leading
    whitespace, as the chat templates trim it when the turn is rendered back.
    """

    markers: dict[str, Markers]
    think_close: str = ""

    def __init__(self, tools: list[dict] | None, thinking: bool) -> None:
        self.channel = THOUGHT if thinking else CONTENT
        self._tools = index_tools(tools)
        self._buf = ""  # held back: a possible marker start (or thinking's last newline)
        self._fresh = True  # at a segment start: leading whitespace is dropped
        self._skip_name = False  # a channel name follows (Gemma's `thought\n`)
        self._call: CallBuilder | None = None
        self._resume = self.channel  # the channel to return to after a call
        self._index = 0
        self._plain = False  # nothing held and no state: the per-token fast path applies

    def feed(self, text: str) -> list[Delta]:
        if self._plain and "<" not in text:
            # Fast path: no marker can start here and nothing is held back.
            if self.channel == CONTENT:
                return [text_delta(text)] if text else []
            if not text.endswith("\n"):
                return [thinking_delta(text)] if text else []
        self._buf += text
        out: list[Delta] = []
        self._run(out)
        return out

    def finish(self) -> list[Delta]:
        out: list[Delta] = []
        while self._call is not None:
            # The end of the output may be what decides an open call (Qwen's); if it does not, the
            # call is text.
            if self._advance_call(out, final=True):
                self._run(out)  # what followed the call, markers and all
                continue
            raw = self._call.raw + self._buf
            self._call = None
            self.channel = self._resume
            # A call opened in the reasoning and never finished: where the model closed its reasoning,
            # the call had ended; what follows (the answer) is read again, markers and all.
            cut = raw.find(self.think_close) if self.channel == THOUGHT and self.think_close else -1
            cut -= cut > 0 and raw[cut - 1] == "\n"  # the newline before the close is the template's
            raw, self._buf = (raw[:cut], raw[cut:]) if cut > 0 else (raw, "")
            self._unparsed(raw, out)
            self._run(out)
        if self._skip_name:
            self._drop_channel_name(self._buf, self.markers[self.channel], final=True)
        if self._buf:
            self._text(self._buf, out)  # a partial marker at the very end is just text
        self._buf = ""
        self._plain = False
        return out

    # -- the scanning loop ------------------------------------------------------------------

    def _run(self, out: list[Delta]) -> None:
        while True:
            if self._call is not None:
                if not self._advance_call(out):
                    break
                continue
            buf = self._buf
            if not buf:
                break
            markers = self.markers[self.channel]
            if self._skip_name:
                if not self._drop_channel_name(buf, markers):
                    break
                continue
            m = markers.search(buf)
            if m is None:
                h = markers.holdback(buf)
                if h and self.channel == THOUGHT and buf[h - 1] == "\n":
                    h -= 1  # it is dropped if the thinking closes right after it
                self._text(buf[:h], out)
                self._buf = buf[h:]
                break
            tok = m.group()
            before = buf[: m.start()]
            if tok == self.think_close and self.channel == THOUGHT and before.endswith("\n"):
                before = before[:-1]  # templates write "\n" before the closer themselves
            self._text(before, out)
            self._buf = buf[m.end() :]
            self._marker(tok, out)
        self._plain = not self._buf and not self._fresh and self._call is None and not self._skip_name

    def _drop_channel_name(self, buf: str, markers: Markers, final: bool = False) -> bool:
        """Drop a channel name up to its newline; False while that is not yet decided.

        Only the first _NAME_MAX characters can be a name, and nothing is decided before a marker
        starting among them could be seen whole, so the outcome never depends on the splits.
        """
        m = markers.search(buf)
        ends = [i for i in (buf.find("\n"), m.start() if m else -1) if i != -1]
        cut = min(ends) if ends else -1
        if cut != -1 and cut <= _NAME_MAX:
            self._buf = buf[cut + 1 :] if buf[cut] == "\n" else buf[cut:]
        elif len(buf) < _NAME_MAX + markers.longest and not final:
            return False
        elif final and cut == -1 and len(buf) <= _NAME_MAX:
            self._buf = ""  # a name cut off at the end
        # else: too long for a name, so it was thinking text after all
        self._skip_name = False
        return True

    def _text(self, text: str, out: list[Delta]) -> None:
        if not text:
            return
        if self._fresh:
            text = text.lstrip()
            if not text:
                return
            self._fresh = False
        out.append(text_delta(text) if self.channel == CONTENT else thinking_delta(text))

    # -- tool calls --------------------------------------------------------------------------

    def _open_call(self, opener: str) -> None:
        self._resume = self.channel
        self.channel = TOOL_CALL
        self._call = self._new_call(opener)

    def _advance_call(self, out: list[Delta], final: bool = False) -> bool:
        call = self._call
        if self._buf:
            call.raw += self._buf
            self._buf = ""
        status = call.advance(final)
        if status == NEED:
            return False
        raw, self._buf = call.raw[: call.end], call.raw[call.end :]
        self._call = None
        self.channel = self._resume
        delta = self._completed(call, raw) if status == DONE else None
        if delta is None:
            self._unparsed(raw, out)
        else:
            out.append(delta)
            self._fresh = True  # whitespace between calls is not content
        return True

    def _completed(self, call: CallBuilder, raw: str) -> ToolCallDelta | None:
        try:
            name, args, textual = call.parse()
            args, outcome = check_arguments(name, args, self._tools, textual)
            arguments = json.dumps(args, ensure_ascii=False, allow_nan=False)
        except ValueError:
            return None
        delta = tool_call_delta(self._index, new_id("call_"), name, arguments, raw, outcome)
        self._index += 1
        return delta

    def _unparsed(self, raw: str, out: list[Delta]) -> None:
        # Never dropped: counted, then returned to the client as the text the model wrote, in the
        # channel it wrote it in (inside its reasoning, reasoning: the blocks keep the model's order).
        out.append(unparsed_call_delta(raw))
        shown = self._fallback_text(raw)
        out.append(text_delta(shown) if self.channel == CONTENT else thinking_delta(shown))
        if self.channel == CONTENT:
            self._fresh = False

    def _fallback_text(self, raw: str) -> str:
        return raw

    # -- family hooks ---------------------------------------------------------------------------

    def _marker(self, tok: str, out: list[Delta]) -> None:
        raise NotImplementedError

    def _new_call(self, opener: str) -> CallBuilder:
        raise NotImplementedError


class ThinkTagParser(StreamParser):
    """`<think>…</think>` reasoning and `<tool_call>…</tool_call>` calls (Qwen3.5 and ChatML).

    `<think>` opens thinking only before any content (hybrid models write it themselves); later it
    is text. A stray `</think>` in content and stop tokens that slip through are dropped.
    """

    think_close = "</think>"
    dropped = ("<|im_end|>", "<|endoftext|>")
    markers = {
        CONTENT: Markers("<think>", "</think>", "<tool_call>", *dropped),
        THOUGHT: Markers("<think>", "</think>", "<tool_call>", *dropped),
    }

    def _marker(self, tok: str, out: list[Delta]) -> None:
        if tok == "<tool_call>":
            self._open_call(tok)
        elif tok == "<think>":
            if self._fresh:  # opens thinking, or repeats the prompt's own `<think>`: not text
                self.channel = THOUGHT
            else:
                self._text(tok, out)
        elif tok == "</think>" and self.channel == THOUGHT:
            self.channel = CONTENT
            self._fresh = True
