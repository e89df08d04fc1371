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

from .base import Family, Parser
from .parsing import DONE, NEED, CallBuilder, ThinkTagParser, expect_one

_PARAM, _FUNC_END = "<parameter=", "</function>"
_VALUE_END = "</parameter>"


class QwenXmlCall(CallBuilder):
    """`<tool_call>` … `</tool_call>` with a `<function=…>` inside, found incrementally.

    A `</parameter>` ends a value only when `<parameter=` or `</function>` follows it (after
    whitespace), so a value may itself contain the literal text `</parameter>`.
    """

    __slots__ = ("_pos", "_step", "_mark", "_scan", "_key_name", "name", "params")

    def __init__(self, opener: str) -> None:
        super().__init__(opener)
        self._pos = len(opener)
        self._step = self._function
        self._mark = 0  # where the current name, key or value starts
        self._scan = 0  # value: how far `</parameter>` has been looked for
        self._key_name = ""
        self.name = ""
        self.params: dict[str, str] = {}

    def advance(self) -> int:
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
        raw = self.raw
        while True:
            i = raw.find(_VALUE_END, self._scan)
            if i == -1:
                self._scan = max(self._scan, len(raw) - len(_VALUE_END) + 1)
                return NEED
            status, _, _ = expect_one(raw, i + len(_VALUE_END), (_PARAM, _FUNC_END))
            if status == NEED:
                self._scan = i
                return NEED
            if status == DONE:
                break
            self._scan = i + 1  # a literal `</parameter>` inside the value
        value = raw[self._mark : i]
        # The template writes one newline on each side of the value.
        value = value[1:] if value.startswith("\n") else value
        value = value[:-1] if value.endswith("\n") else value
        self.params[self._key_name] = value
        self._pos = i + len(_VALUE_END)
        self._step = self._params
        return None

    def _tail(self) -> int | None:
        status, _, at = expect_one(self.raw, self._pos, ("</tool_call>",))
        if status != DONE:
            return status if status == NEED else self._fail(at)
        self.end = at
        return DONE


class QwenParser(ThinkTagParser):
    def _new_call(self, opener: str) -> CallBuilder:
        return QwenXmlCall(opener)


class Qwen3_5(Family):
    name = "qwen3_5"
    model_types = ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")
    architectures = ("Qwen3_5",)
    system_first_only = True  # "System message must be at the beginning."
    stop_tokens = ("<|im_end|>", "<|endoftext|>")
    grammar_tokens = ("<think>", "</think>", "<tool_call>", "</tool_call>")
    # The model card's recommendations (Qwen3.5 ships no generation_config.json).
    media_tokens = {"<|image_pad|>": "image", "<|video_pad|>": "video", "<|audio_pad|>": "audio"}
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
