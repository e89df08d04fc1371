"""ChatML/Hermes models (Qwen2.5, Qwen3, SmolLM2/3 and similar): `<|im_start|>` turns, optional
`<think>` reasoning, and JSON tool calls `<tool_call>{"name": …, "arguments": {…}}</tool_call>`.
"""

from __future__ import annotations

import json
import re

from .base import Family, Parser, UnsupportedModel
from .parsing import BAD, DONE, NEED, CallBuilder, ThinkTagParser, expect_one

_CLOSE = "</tool_call>"
_OUTSIDE = re.compile(r'["{}\[\]]|</tool_call>')  # outside a JSON string: what matters
_INSIDE = re.compile(r'["\\]')  # inside one: its end, or an escape


def chat_template_is_chatml(template: str | dict | None) -> bool:
    """Whether a chat template writes ChatML turns (and so this family's format)."""
    if isinstance(template, dict):  # named templates: the default one is what render uses
        template = template.get("default")
    return isinstance(template, str) and "<|im_start|>" in template


class HermesCall(CallBuilder):
    """`<tool_call>` + one JSON object + `</tool_call>`; braces or the closer inside strings are text."""

    __slots__ = ("_pos", "_state", "_depth", "_json_at", "_json_end")

    def __init__(self, opener: str) -> None:
        super().__init__(opener)
        self._pos = len(opener)
        self._state = "open"
        self._depth = 0
        self._json_at = self._json_end = 0

    def advance(self, final: bool = False) -> int:
        raw = self.raw
        while True:
            state = self._state
            if state == "open":
                status, _, at = expect_one(raw, self._pos, ("{",))
                if status != DONE:
                    return NEED if status == NEED else self._fail(at)
                self._json_at = at - 1
                self._pos = at
                self._depth = 1
                self._state = "object"
            elif state == "string":
                m = _INSIDE.search(raw, self._pos)
                if m is None:
                    self._pos = len(raw)
                    return NEED
                if m.group() == "\\":
                    if m.end() == len(raw):
                        self._pos = m.start()  # the escaped character has not arrived yet
                        return NEED
                    self._pos = m.end() + 1
                else:
                    self._pos = m.end()
                    self._state = "object"
            elif state == "object":
                m = _OUTSIDE.search(raw, self._pos)
                if m is None:
                    self._pos = max(self._pos, len(raw) - len(_CLOSE) + 1)
                    return NEED
                tok = m.group()
                self._pos = m.end()
                if tok == '"':
                    self._state = "string"
                elif tok == _CLOSE:
                    self.end = m.end()  # closed mid-object: parse() refuses it
                    return DONE
                elif tok in "{[":
                    self._depth += 1
                else:
                    self._depth -= 1
                    if self._depth == 0:
                        self._json_end = m.end()
                        self._state = "tail"
            else:  # tail
                status, _, at = expect_one(raw, self._pos, (_CLOSE,))
                if status == DONE:
                    self.end = at
                return self._fail(at) if status == BAD else status

    def parse(self) -> tuple[str, dict, bool]:
        if self._state != "tail":
            raise ValueError("unbalanced JSON")
        call = json.loads(self.raw[self._json_at : self._json_end])
        name = call.get("name")
        args = call.get("arguments", call.get("parameters"))
        if isinstance(args, str):
            args = json.loads(args)  # some models write the arguments as a JSON string
        if args is None:
            args = {}
        if not isinstance(name, str) or not name or not isinstance(args, dict):
            raise ValueError("not a function call")
        return name, args, False


class HermesParser(ThinkTagParser):
    def _new_call(self, opener: str) -> CallBuilder:
        return HermesCall(opener)


class ChatML(Family):
    """Chosen from config.json for these model types; the template must also be ChatML."""

    name = "chatml"
    model_types = ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "llama", "mistral", "smollm3", "olmo2")
    architectures = ("Qwen2", "Qwen3", "Llama", "Mistral", "SmolLM3", "Olmo2")
    stop_tokens = ("<|im_end|>",)
    turn_end_tokens = ("<|im_end|>",)
    grammar_tokens = ("<think>", "</think>", "<tool_call>", "</tool_call>")
    # The Qwen model cards' recommendation for answers without reasoning; used when the
    # checkpoint has no generation_config values.
    card_sampling = {
        True: {"temperature": 0.7, "top_p": 0.8, "top_k": 20},
        False: {"temperature": 0.7, "top_p": 0.8, "top_k": 20},
    }

    def __init__(self, tokenizer, generation_config: dict | None = None, processor=None) -> None:
        template = getattr(tokenizer, "chat_template", None)
        if not chat_template_is_chatml(template):
            raise UnsupportedModel(
                "this checkpoint's chat template does not write ChatML turns (<|im_start|>), "
                "so its tool-call and reasoning format is unknown here")
        super().__init__(tokenizer, generation_config, processor)

    def prompt_leaves_thinking(self, prompt: str) -> bool:
        return prompt.rstrip().endswith("<think>")

    def new_parser(self, tools: list[dict] | None, thinking: bool) -> Parser:
        return HermesParser(tools, thinking)

    def forced_call_prefix(self, name: str | None, thinking: bool) -> str:
        # No `</think>`: whether the prompt opened one depends on the template (Qwen3 lets the
        # model write it), and a call inside thinking is parsed all the same. ensure_ascii off: the
        # markers that keep a name's control tokens text (base.forced_call_ids) must stay as they are.
        prefix = '<tool_call>\n{"name": "'
        return prefix + (json.dumps(name, ensure_ascii=False)[1:-1] + '", "arguments": ' if name else "")
