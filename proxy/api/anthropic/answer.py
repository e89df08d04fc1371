"""Channel deltas → an Anthropic Message: the whole answer as one object (not streamed), and what the
stream shares with it: usage, the stop reason, thinking signatures, tool_use input."""

from __future__ import annotations

import hashlib
import json

from looptrace.families.base import new_id
from looptrace.families.deltas import TextDelta, ThinkingDelta, ToolCallDelta, UnparsedCallDelta, dispatch

from ...engine.generation import Generation
from ...engine.request import Step

STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}  # else end_turn, or stop_sequence


def message_id() -> str:
    return new_id("msg_")


def stop_reason(generation: Generation) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of a finished generation."""
    if generation.stop_sequence is not None:
        return "stop_sequence", generation.stop_sequence
    return STOP_REASONS.get(generation.finish_reason or "", "end_turn"), None


def usage(generation: Generation) -> dict:
    """Anthropic counts a prompt in parts that add up to it: read from a prefix cache, and the rest
    (`input_tokens`). What this request wrote to a cache is not split out (the trace has it): the
    stream must give its split in message_start, before the backend has said what it kept."""
    cached = generation.cached_tokens
    return {"input_tokens": max(generation.prompt_tokens - cached, 0), "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached, "output_tokens": generation.completion_tokens}


def signature(thinking: str) -> str:
    """Ours, for a thinking block: its text's digest. A client's signature sent back is ignored, so
    this only has to be a string a client can keep and return."""
    return hashlib.sha256(thinking.encode("utf-8", "surrogatepass")).hexdigest()


def tool_input(delta: ToolCallDelta) -> dict:
    """A call's arguments as the object tool_use carries (the parser writes a JSON object)."""
    try:
        value = json.loads(delta["arguments"])
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def tool_use_block(delta: ToolCallDelta, input: dict) -> dict:
    return {"type": "tool_use", "id": delta["id"], "name": delta["name"], "input": input}


class MessageCollector:
    """The answer's content blocks in the order the model wrote them, consecutive text (or thinking)
    in one block."""

    def __init__(self, model: str, *, token_ids: bool = False, thinking_shown: bool = True,
                 applied_edits: list[dict] | None = None) -> None:
        self.id = message_id()
        self.model = model
        self.blocks: list[dict] = []
        self.ids: list[int] | None = [] if token_ids else None  # return_token_ids: every token's id
        self.thinking_shown = thinking_shown  # False: display "omitted", a thinking block's text left out
        self.applied_edits = applied_edits  # None: the request asked for no context_management

    def add(self, step: Step) -> None:
        if self.ids is not None and step.token is not None:
            self.ids.append(step.token["id"])
        if step.deltas:
            dispatch(step.deltas, self)

    def _text(self, kind: str, text: str) -> None:
        if not text:
            return
        last = self.blocks[-1] if self.blocks else None
        if last is not None and last["type"] == kind:
            last[kind] += text
        else:
            self.blocks.append({"type": kind, kind: text})

    # DeltaHandler: the answer, gathered.

    def text(self, delta: TextDelta) -> None:
        self._text("text", delta["text"])

    def thinking(self, delta: ThinkingDelta) -> None:
        self._text("thinking", delta["text"])

    def tool_call(self, delta: ToolCallDelta) -> None:
        self.blocks.append(tool_use_block(delta, tool_input(delta)))

    def unparsed_call(self, delta: UnparsedCallDelta) -> None:
        return None  # its text follows as a text delta

    def body(self, generation: Generation) -> dict:
        for block in self.blocks:
            if block["type"] == "thinking":
                block["signature"] = signature(block["thinking"])
                if not self.thinking_shown:
                    block["thinking"] = ""
        reason, sequence = stop_reason(generation)
        body = {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": self.blocks,
                "stop_reason": reason, "stop_sequence": sequence, "usage": usage(generation)}
        if self.applied_edits is not None:
            body["context_management"] = {"applied_edits": self.applied_edits}
        if self.ids is not None:  # named as vLLM names them on Chat Completions; a message has no choices
            body["prompt_token_ids"], body["token_ids"] = generation.prompt_ids, self.ids
        return body
