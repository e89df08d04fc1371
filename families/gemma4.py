"""Gemma 4: `<|turn>` turns, `<|channel>thought\\n…<channel|>` reasoning, and tool calls
`<|tool_call>call:NAME{…}<tool_call|>`.

The arguments use Gemma's own syntax (gemma4_values.py), strings delimited by the `<|"|>` token.
With thinking on the model opens its thought channel itself; with it off the generation prompt
already ends with an empty one, so output always starts in content.
"""

from __future__ import annotations

import re

from .base import CONTENT, THOUGHT, Family, Parser
from .deltas import Delta
from .gemma4_values import QUOTE, parse_arguments
from .parsing import BAD, DONE, NEED, CallBuilder, Markers, StreamParser, expect_exact

_OPEN, _CLOSE = "<|tool_call>", "<tool_call|>"
# Outside a string: the tokens that change nesting, a string start (the token, or `'` where a value
# starts: an apostrophe inside a bare word is text), the closer, or a new opener.
_STRUCTURE = re.compile(r'<\|"\|>|(?<=[:\[,])\s*\'|[{}\[\]]|<tool_call\|>|<\|tool_call>')
_SQUOTE_STEP = re.compile(r"\\.|'", re.S)  # inside a single-quoted string: an escape pair, or its end
_NAME_END = re.compile(r"[^\w.\-/]")  # a function name is a word, maybe dotted (namespace.tool)
_HOLD = len(_OPEN) - 1  # a marker cut at the end of the text seen so far is this long at most


class GemmaCall(CallBuilder):
    """`<|tool_call>call:NAME{…}<tool_call|>`, its end found by tracking nesting and strings."""

    __slots__ = ("_pos", "_state", "_depth", "_name_at", "_body_at", "_body_end")

    def __init__(self, opener: str) -> None:
        super().__init__(opener)
        self._pos = len(opener)
        self._state = "head"
        self._depth = 0
        self._name_at = self._body_at = self._body_end = 0

    def advance(self, final: bool = False) -> int:
        raw = self.raw
        while True:
            state = self._state
            if state == "head":
                status = expect_exact(raw, self._pos, "call:")
                if status != DONE:
                    return NEED if status == NEED else self._fail(self._pos)
                self._pos = self._name_at = self._pos + len("call:")
                self._state = "name"
            elif state == "name":
                m = _NAME_END.search(raw, self._pos)
                if m is None:
                    self._pos = len(raw)
                    return NEED
                at = m.start()
                if raw[at] != "{" or at == self._name_at:
                    return self._fail(at)
                self._pos = at + 1
                self._body_at = at
                self._depth = 1
                self._state = "body"
            elif state == "string":
                end = raw.find(QUOTE, self._pos)
                if end == -1:
                    self._pos = max(self._pos, len(raw) - len(QUOTE) + 1)
                    return NEED
                self._pos = end + len(QUOTE)
                self._state = "body"
            elif state == "squote":
                pos = self._pos
                for m in _SQUOTE_STEP.finditer(raw, pos):
                    if m.group() == "'":
                        self._pos = m.end()
                        self._state = "body"
                        break
                    pos = m.end()
                else:
                    # Resumed next time where it stopped; a backslash at the very end waits for the
                    # character it escapes.
                    self._pos = len(raw) - 1 if raw.endswith("\\") and pos < len(raw) else len(raw)
                    return NEED
            elif state == "body":
                m = _STRUCTURE.search(raw, self._pos)
                if m is None:
                    self._pos = max(self._pos, len(raw) - _HOLD)
                    return NEED
                tok = m.group()
                self._pos = m.end()
                if tok == QUOTE:
                    self._state = "string"
                elif tok.endswith("'"):
                    self._state = "squote"
                elif tok in "{[":
                    self._depth += 1
                elif tok in "}]":
                    self._depth -= 1
                    if self._depth == 0:
                        self._body_end = m.end()
                        self._state = "tail"
                elif tok == _CLOSE:
                    self.end = m.end()  # closed while still nested: parse() refuses it
                    return DONE
                else:
                    return self._fail(m.start())  # a new opener: this call never closed
            else:  # tail: the closer right after the arguments
                status = expect_exact(raw, self._pos, _CLOSE)
                if status == DONE:
                    self.end = self._pos + len(_CLOSE)
                return self._fail(self._pos) if status == BAD else status

    def parse(self) -> tuple[str, dict, bool]:
        if self._state != "tail":
            raise ValueError("unbalanced arguments")
        name = self.raw[self._name_at : self._body_at]
        return name, parse_arguments(self.raw[self._body_at : self._body_end]), False


class GemmaParser(StreamParser):
    """Thought channels and calls; `<|"|>` outside a call is shown as `"`, never as the token."""

    think_close = "<channel|>"
    dropped = ("<turn|>", "<|tool_response>")  # stop tokens, should one get through
    markers = {
        CONTENT: Markers("<|channel>", "<channel|>", _OPEN, QUOTE, *dropped),
        THOUGHT: Markers("<|channel>", "<channel|>", _OPEN, QUOTE, *dropped),
    }

    def __init__(self, tools: list[dict] | None, thinking: bool) -> None:
        # Output starts in content either way: the model opens its thought channel itself.
        super().__init__(tools, False)

    def _marker(self, tok: str, out: list[Delta]) -> None:
        if tok == _OPEN:
            self._open_call(tok)
        elif tok == "<|channel>":
            self.channel = THOUGHT  # any channel but the answer is reasoning
            self._fresh = True
            self._skip_name = True
        elif tok == "<channel|>":
            if self.channel == THOUGHT:
                self.channel = CONTENT
                self._fresh = True
            else:  # a closer with no channel open: what the model wrote, shown, not lost
                self._text(tok, out)
        elif tok == QUOTE:
            self._text('"', out)

    def _new_call(self, opener: str) -> CallBuilder:
        return GemmaCall(opener)

    def _fallback_text(self, raw: str) -> str:
        return raw.replace(QUOTE, '"')


class Gemma4(Family):
    name = "gemma4"
    model_types = ("gemma4", "gemma4_text")
    architectures = ("Gemma4",)
    # `<|tool_response>` is how the model says "run my tool": generation stops there.
    stop_tokens = ("<eos>", "<turn|>", "<|tool_response>")
    # A turn ends with `<turn|>`; a call, with the `<|tool_response>` its result follows.
    turn_end_tokens = ("<turn|>", "<|tool_response>")
    grammar_tokens = ("<|channel>", "<channel|>", _OPEN, _CLOSE, QUOTE)
    # The model card's recommendations, used when the checkpoint has no generation_config.
    media_tokens = {"<|image|>": "image", "<|video|>": "video", "<|audio|>": "audio"}
    processor_class = "Gemma4Processor"
    tool_result_media = False  # its template keeps only a tool output's text
    transient_prompt_tail = "<|channel>thought\n<channel|>"
    card_sampling = {
        True: {"temperature": 1.0, "top_p": 0.95, "top_k": 64},
        False: {"temperature": 1.0, "top_p": 0.95, "top_k": 64},
    }

    def new_parser(self, tools: list[dict] | None, thinking: bool) -> Parser:
        return GemmaParser(tools, thinking)

    def forced_call_prefix(self, name: str | None, thinking: bool) -> str:
        # With thinking on, close an empty thought first, as the template does with it off.
        prefix = "<|channel>thought\n<channel|>" if thinking else ""
        prefix += _OPEN + "call:"
        return prefix + (name + "{" if name else "")
