"""Qwen3.5: ChatML turns, `<think>` reasoning, XML-style tool calls with plain-text values.

    <tool_call>
    <function=NAME>
    <parameter=KEY>
    VALUE
    </parameter>
    </function>
    </tool_call>

Values are text typed by the tool's schema (tool_schema.py). Qwen3.5 ships no generation_config.json,
so its stop tokens and sampling defaults come from here.
"""

from __future__ import annotations

import re

from .base import Family, Parser
from .parsing import BAD, DONE, NEED, CallBuilder, ThinkTagParser, expect_one

_PARAM, _FUNC_END = "<parameter=", "</function>"
_VALUE_END = "</parameter>"
_END_FOLLOWERS = ("<tool_call>", "<|im_end|>", "<|endoftext|>")  # what may follow a call's real end
# The markup a value may itself hold, each opener with its closer: (tool_call, function, parameter).
_OPENERS = {"<tool_call>": "t", "<function=": "f", _PARAM: "p"}
_CLOSERS = {"</tool_call>": "t", _FUNC_END: "f", _VALUE_END: "p"}
_VALUE_MARKS = re.compile("|".join(re.escape(m) for m in sorted((*_OPENERS, *_CLOSERS), key=len, reverse=True)))
_MARK_MAX = max(len(m) for m in (*_OPENERS, *_CLOSERS))
_NAME_MAX = 256  # a parameter name longer than this is value text
# _after_close() results besides NEED, DONE (the call ends) and BAD.
_NEXT = 3  # the tool's next parameter follows
_LOOSE = 4  # the call's end follows, then other text


class QwenXmlCall(CallBuilder):
    """`<tool_call>` … `</tool_call>` with a `<function=…>` inside, found incrementally.

    A value is plain text and may itself hold the markup (an agent writing a parser test, or this
    very format, into a file), so its end is decided by nesting and by what follows, not by the
    first marker:

    - markup the value opens (`<tool_call>`, `<function=NAME>`, `<parameter=NAME>`) is the value's
      until its own closer; only a `</parameter>` that closes nothing opened inside the value may
      end it, so a whole call written into a value stays there, whatever names it uses;
    - such a `</parameter>` ends the value when `<parameter=NAME>` follows with NAME one of the
      tool's parameters (any name when the schema is not known), or when the call's end follows;
    - the call's end is `</function>`, `</tool_call>`, then the end of the output, another call or
      a stop token; a `</tool_call>` with other text after it may be a literal inside the value, so
      the last such end is used only if no better one comes before the output ends;
    - the model's slips are recovered once the call's end (or the output's) shows the value never
      closed: it ended at a `<parameter=NAME>` on a new line, opened at the value's own level, where
      NAME is another of the tool's parameters (its `</parameter>` was left out), or at the
      `</parameter>` that closed a `<parameter=…>` the value had opened at its own level as text
      (`use a <parameter=x> tag`), whichever came first; else at the call's end. Once one value of
      a call ended at a slip, later slips of that call are taken as they come.
    """

    __slots__ = ("_pos", "_step", "_mark", "_scan", "_key_name", "_tools", "_keys", "_opened", "_slip", "_loose",
                 "_loose_end", "_unlisted", "_slipped", "_final", "name", "params")

    def __init__(self, opener: str, tools: dict[str, dict] | None = None) -> None:
        super().__init__(opener)
        self._pos = len(opener)
        self._step = self._function
        self._mark = 0  # where the current name, key or value starts
        self._scan = 0  # value: how far its end has been looked for
        self._key_name = ""
        self._tools = tools
        self._keys: frozenset[str] | None = None  # the tool's parameter names, when its schema says
        # Per value, while its end is looked for:
        self._opened: list[str] = []  # the markup it opened and has not closed, innermost last
        self._slip: tuple[int, int, int] | None = None  # (value end, next position, call end or -1): a slip's end
        self._loose: tuple[int, int] | None = None  # (value end, call end): its close, then a call end with text after
        self._loose_end: tuple[int, int] | None = None  # the same without its close
        # (value end, next position): its close, then `<parameter=NAME>` with a NAME the tool lacks. A
        # parameter the model added, if nothing but that parameter's own end follows (a slip's end).
        self._unlisted: tuple[int, int] | None = None
        self._slipped = False  # a value of this call ended at a slip: later slips are taken at once
        self._final = False  # the output has ended: nothing more will come
        self.name = ""
        self.params: dict[str, str] = {}

    def advance(self, final: bool = False) -> int:
        self._final = final
        while True:
            status = self._step()
            if status is not None:
                return status

    def parse(self) -> tuple[str, dict, bool]:
        return self.name, self.params, True

    def _function(self) -> int | None:
        status, _, at = expect_one(self.raw, self._pos, ("<function=",))
        if status != DONE:
            return status if status == NEED else self._fail(at)
        self._pos = self._mark = at
        self._step = self._name
        return None

    def _read_word(self) -> tuple[int | None, str]:
        """A function name or parameter key, up to `>`; (status, word) with status None when read."""
        raw = self.raw
        i = self._pos
        while i < len(raw) and raw[i] != ">":
            if raw[i].isspace() or raw[i] == "<":
                return self._fail(i), ""
            i += 1
        self._pos = i
        if i == len(raw):
            return NEED, ""
        if i == self._mark:
            return self._fail(i), ""  # no name at all
        self._pos = i + 1
        return None, raw[self._mark : i]

    def _name(self) -> int | None:
        status, self.name = self._read_word()
        if status is None:
            schema = self._tools.get(self.name) if self._tools else None
            props = schema.get("properties") if isinstance(schema, dict) else None
            self._keys = frozenset(props) if isinstance(props, dict) and props else None
            self._step = self._params
        return status

    def _params(self) -> int | None:
        status, which, at = expect_one(self.raw, self._pos, (_PARAM, _FUNC_END))
        if status != DONE:
            return status if status == NEED else self._fail(at)
        self._pos = self._mark = at
        self._step = self._key if which == 0 else self._tail
        return None

    def _key(self) -> int | None:
        status, key = self._read_word()
        if status is None:
            self._key_name = key
            self._mark = self._scan = self._pos
            self._opened = []
            self._slip = self._loose = self._loose_end = self._unlisted = None
            self._step = self._value
        return status

    def _value(self) -> int | None:
        raw, opened = self.raw, self._opened
        while True:
            m = _VALUE_MARKS.search(raw, self._scan)
            if m is None:
                if self._final:
                    return self._settle(None)
                self._scan = max(self._scan, len(raw) - _MARK_MAX + 1)
                return NEED
            i, mark, after = m.start(), m.group(), m.end()
            if mark in _OPENERS:  # markup the value holds, once it is whole
                kind = _OPENERS[mark]
                status, name = (DONE, "") if kind == "t" else self._name_at(after)
                if status == NEED:
                    self._scan = i
                    return NEED
                if status == DONE:
                    if (kind == "p" and not opened and self._slip is None and self._keys and name in self._keys
                            and raw[i - 1 : i] == "\n"):
                        self._slip = (i, i, -1)  # or the value's `</parameter>` was left out before it
                        if self._slipped:
                            return self._take_slip()
                    opened.append(kind)
            elif opened and opened[-1] == _CLOSERS[mark]:  # closes what the value opened
                if mark == _VALUE_END and len(opened) == 1 and self._slip is None:
                    status, to = self._after_close(after)
                    if status == NEED:
                        self._scan = i
                        return NEED
                    if status == _NEXT or status == DONE:  # or it was the value's own close after all
                        self._slip = (i, to, -1) if status == _NEXT else (i, after, to)
                        if self._slipped:
                            return self._take_slip()
                opened.pop()
            elif mark == _VALUE_END:  # the value's own close, if what follows says so
                status, to = self._after_close(after)
                if status == NEED:
                    self._scan = i
                    return NEED
                if status == _NEXT:
                    return self._next_param(i, to)
                if status == DONE:
                    return self._finish_value(i, to)
                if status == _LOOSE:
                    self._loose = (i, to)
                if status == BAD and to and self._unlisted is None:
                    self._unlisted = (i, to)
            elif mark == _FUNC_END:  # the call's end with the value's close left out?
                status, to = self._call_end(after)
                if status == NEED:
                    self._scan = i
                    return NEED
                if status == DONE:
                    return self._settle((i, to))
                if status == _LOOSE:
                    self._loose_end = (i, to)
            # else a `</tool_call>` the value did not open: text
            self._scan = after

    def _settle(self, call_end: tuple[int, int] | None) -> int | None:
        """The value never closed before the call's end (`call_end`: where `</function>` begins and the
        call ends) or, with None, the output's: the end that fits best."""
        if call_end is None and self._loose is not None:
            return self._finish_value(*self._loose)  # closed, though text follows the call
        if self._slip is not None:
            return self._take_slip()
        if self._unlisted is not None:
            return self._next_param(*self._unlisted)
        end = call_end or self._loose_end
        return self._finish_value(*end) if end is not None else NEED

    def _take_slip(self) -> int | None:
        # What follows the slip is scanned again; taking the call's later slips at once keeps a call
        # that slips at every value (a model repeating itself) one linear scan.
        self._slipped = True
        value_end, pos, end = self._slip
        unlisted = self._unlisted
        if unlisted is not None and unlisted[0] < value_end:
            # The close before a parameter the tool lacks ended the value: that parameter, opened at
            # the value's level, is what ended at the slip (opencode's bash given a `description`).
            return self._next_param(*unlisted)
        return self._next_param(value_end, pos) if end < 0 else self._finish_value(value_end, end)

    def _name_at(self, at: int) -> tuple[int, str]:
        """A name at raw[at:] (after `<parameter=` or `<function=`), up to `>`: (DONE, name), NEED, BAD."""
        close = self.raw.find(">", at, at + _NAME_MAX + 1)
        if close == -1:
            return (NEED if len(self.raw) - at <= _NAME_MAX and not self._final else BAD), ""
        name = self.raw[at:close]
        if not name or any(c.isspace() or c == "<" for c in name):
            return BAD, ""
        return DONE, name

    def _after_close(self, after: int) -> tuple[int, int]:
        """What follows a `</parameter>` that ends at `after`: (_NEXT, after) when the tool's next
        parameter does, (DONE, where the call ends) or (_LOOSE, …) when the call's end does
        (_call_end), else NEED while undecided or BAD."""
        status, which, at = expect_one(self.raw, after, (_PARAM, _FUNC_END))
        if status != DONE:
            return (NEED if status == NEED and not self._final else BAD), 0
        if which == 1:
            return self._call_end(at)
        status, name = self._name_at(at)
        if status == DONE:  # (BAD, where it starts) for a name the tool lacks: a parameter, or value text
            return (_NEXT, after) if self._keys is None or name in self._keys else (BAD, after)
        return status, 0

    def _call_end(self, at: int) -> tuple[int, int]:
        """After `</function>` at raw[at:]: (DONE, where the call ends) when `</tool_call>` and then
        the output's end, another call or a stop token follow; (_LOOSE, where the call ends) when
        other text does; NEED while undecided; BAD without `</tool_call>`."""
        raw, final = self.raw, self._final
        status, _, end = expect_one(raw, at, ("</tool_call>",))
        if status != DONE:
            return (NEED if status == NEED and not final else BAD), 0
        after = end
        while after < len(raw) and raw[after].isspace():
            after += 1
        rest = raw[after : after + 16]
        if not rest:
            return (DONE if final else NEED), end
        if rest.startswith(_END_FOLLOWERS):
            return DONE, end
        if not final and any(f.startswith(rest) for f in _END_FOLLOWERS):
            return NEED, 0
        return _LOOSE, end

    def _next_param(self, value_end: int, pos: int) -> int | None:
        self._store_value(value_end)
        self._pos = pos
        self._step = self._params
        return None

    def _finish_value(self, value_end: int, end: int) -> int:
        self._store_value(value_end)
        self.end = end
        return DONE

    def _store_value(self, value_end: int) -> None:
        raw = self.raw
        # `value_end` is where `</parameter>` (or the mark standing in for it) begins.
        value = raw[self._mark : value_end]
        # The template writes one newline on each side of the value.
        value = value[1:] if value.startswith("\n") else value
        value = value[:-1] if value.endswith("\n") else value
        self.params[self._key_name] = value

    def _tail(self) -> int | None:
        status, _, at = expect_one(self.raw, self._pos, ("</tool_call>",))
        if status != DONE:
            return status if status == NEED else self._fail(at)
        self.end = at
        return DONE


class QwenParser(ThinkTagParser):
    def _new_call(self, opener: str) -> CallBuilder:
        return QwenXmlCall(opener, self._tools)


class Qwen3_5(Family):
    name = "qwen3_5"
    model_types = ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")
    architectures = ("Qwen3_5",)
    system_first_only = True  # "System message must be at the beginning."
    stop_tokens = ("<|im_end|>", "<|endoftext|>")
    turn_end_tokens = ("<|im_end|>",)
    grammar_tokens = ("<think>", "</think>", "<tool_call>", "</tool_call>")
    # The model card's recommendations (Qwen3.5 ships no generation_config.json).
    media_tokens = {"<|image_pad|>": "image", "<|video_pad|>": "video", "<|audio_pad|>": "audio"}
    processor_class = "Qwen3VLProcessor"  # what Qwen3.5 checkpoints name
    card_sampling = {
        True: {"temperature": 1.0, "top_p": 0.95, "top_k": 20},
        False: {"temperature": 0.7, "top_p": 0.8, "top_k": 20},
    }

    def prompt_leaves_thinking(self, prompt: str) -> bool:
        # `<think>\n` open at the end; with thinking off the prompt ends `</think>\n\n`.
        return prompt.rstrip().endswith("<think>")

    def new_parser(self, tools: list[dict] | None, thinking: bool) -> Parser:
        return QwenParser(tools, thinking)

    def forced_call_prefix(self, name: str | None, thinking: bool) -> str:
        prefix = "\n</think>\n\n" if thinking else ""
        prefix += "<tool_call>\n<function="
        return prefix + (f"{name}>\n" if name else "")
