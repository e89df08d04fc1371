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
_VALUE_MARKS = re.compile(re.escape(_VALUE_END) + "|" + re.escape(_PARAM) + "|" + re.escape(_FUNC_END))
_NAME_MAX = 256  # a parameter name longer than this is value text


class QwenXmlCall(CallBuilder):
    """`<tool_call>` … `</tool_call>` with a `<function=…>` inside, found incrementally.

    A value is plain text and may itself hold the markup (an agent writing a parser test, or this
    very format, into a file), so its end is decided by what follows, not by the first marker:

    - `</parameter>` ends it when `<parameter=NAME>` follows with NAME one of the tool's parameters
      (any name when the schema is not known), or when the call's end follows;
    - the call's end is `</function>`, `</tool_call>`, then the end of the output, another call or
      a stop token; a `</tool_call>` with other text after it may be a literal inside the value, so
      the last such end is used only if no better one comes before the output ends;
    - the model's slips are recovered: a value whose `</parameter>` is missing ends at the call's
      end, or at `<parameter=NAME>` on a new line where NAME is another of the tool's parameters.
    """

    __slots__ = ("_pos", "_step", "_mark", "_scan", "_key_name", "_tools", "_keys", "_fallback", "_final", "name",
                 "params")

    def __init__(self, opener: str, tools: dict[str, dict] | None = None) -> None:
        super().__init__(opener)
        self._pos = len(opener)
        self._step = self._function
        self._mark = 0  # where the current name, key or value starts
        self._scan = 0  # value: how far its end has been looked for
        self._key_name = ""
        self._tools = tools
        self._keys: frozenset[str] | None = None  # the tool's parameter names, when its schema says
        self._fallback: tuple[int, int] | None = None  # (value end, call end) of a `</tool_call>` with text after
        self._final = False  # the output has ended: nothing more will come
        self.name = ""
        self.params: dict[str, str] = {}

    def advance(self, final: bool = False) -> int:
        self._final = final
        while True:
            status = self._step()
            if status is not None:
                if status == NEED and final and self._fallback is not None:
                    return self._finish_value(*self._fallback)
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
            self._step = self._value
        return status

    def _value(self) -> int | None:
        raw, final = self.raw, self._final
        while True:
            m = _VALUE_MARKS.search(raw, self._scan)
            if m is None:
                self._scan = max(self._scan, len(raw) - len(_VALUE_END) + 1)
                return NEED
            i, mark = m.start(), m.group()
            if mark == _VALUE_END:
                status, which, at = expect_one(raw, m.end(), (_PARAM, _FUNC_END))
                if status == DONE and which == 0:
                    status, known = self._known_key(at)
                    if status == DONE and known:
                        return self._next_param(i, m.end())
                elif status == DONE:
                    status, end = self._call_end(at, final, i)
                    if status == DONE:
                        return self._finish_value(i, end)
            elif mark == _PARAM:  # no `</parameter>` before it: another parameter, on a new line?
                status, known = self._known_key(m.end()) if self._keys else (BAD, False)
                if status == DONE and known and raw[i - 1 : i] == "\n":
                    return self._next_param(i, i)
            elif not raw[self._mark : i].rstrip().endswith(_VALUE_END):
                # `</function>` with no `</parameter>` before it: the value's end was left out?
                status, end = self._call_end(m.end(), final, i)
                if status == DONE:
                    return self._finish_value(i, end)
            else:
                status = BAD  # after `</parameter>`: that mark was the candidate, and is decided
            if status == NEED:
                self._scan = i
                return NEED
            self._scan = i + 1  # the mark is value text

    def _known_key(self, at: int) -> tuple[int, bool]:
        """A parameter name at raw[at:] (after `<parameter=`): is it one the tool has?"""
        close = self.raw.find(">", at, at + _NAME_MAX + 1)
        if close == -1:
            return (NEED if len(self.raw) - at <= _NAME_MAX else BAD), False
        name = self.raw[at:close]
        if not name or any(c.isspace() or c == "<" for c in name):
            return BAD, False
        return DONE, self._keys is None or name in self._keys

    def _call_end(self, at: int, final: bool, value_end: int) -> tuple[int, int]:
        """After `</function>` at raw[at:]: (DONE, where the call ends) when `</tool_call>` and then
        the output's end, another call or a stop token follow; NEED while undecided; BAD if not.
        A complete `</tool_call>` with other text after it is remembered as the fallback, with the
        value ending at `value_end`."""
        raw = self.raw
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
        if any(f.startswith(rest) for f in _END_FOLLOWERS):
            return (BAD if final else NEED), 0
        self._fallback = (value_end, end)
        return BAD, 0

    def _next_param(self, value_end: int, pos: int) -> int | None:
        self._store_value(value_end)
        self._pos = pos
        self._fallback = None
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
