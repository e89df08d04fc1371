"""Channel deltas → a Gemini GenerateContentResponse: the whole answer (not streamed), and what the
stream shares with it: the finish reason, usage, a function call's part.

One candidate, index 0, role `model`. Thought parts (`thought: true`) are sent only where the request
asked for them (thinkingConfig.includeThoughts), as Google does; their tokens are counted either way.
"""

from __future__ import annotations

import json

from looptrace.families.base import new_id
from looptrace.families.deltas import TextDelta, ThinkingDelta, ToolCallDelta, UnparsedCallDelta, dispatch

from ...engine.generation import Generation
from ...engine.request import Step


def response_id() -> str:
    return new_id("")


def finish_reason(generation: Generation, malformed: bool) -> str:
    """STOP after an answer, a stop sequence or a function call; MAX_TOKENS for a cut; a call the model
    opened and did not write as one is MALFORMED_FUNCTION_CALL (its text is in the answer)."""
    if generation.finish_reason == "length":
        return "MAX_TOKENS"
    return "MALFORMED_FUNCTION_CALL" if malformed else "STOP"


def usage(generation: Generation) -> dict:
    """Google counts thoughts apart from the candidates' tokens; the total adds them all up."""
    thoughts = generation.reasoning_tokens
    candidates = max(generation.completion_tokens - thoughts, 0)
    out = {"promptTokenCount": generation.prompt_tokens, "candidatesTokenCount": candidates,
           "totalTokenCount": generation.prompt_tokens + candidates + thoughts}
    if thoughts:
        out["thoughtsTokenCount"] = thoughts
    if generation.cached_tokens:
        out["cachedContentTokenCount"] = generation.cached_tokens
    return out


def call_part(delta: ToolCallDelta) -> dict:
    """A call as a functionCall part: its id kept (the client sends it back with the response)."""
    try:
        args = json.loads(delta["arguments"])
    except json.JSONDecodeError:
        args = {}
    return {"functionCall": {"id": delta["id"], "name": delta["name"], "args": args if isinstance(args, dict) else {}}}


def candidate(parts: list[dict], reason: str | None = None) -> dict:
    out: dict = {"content": {"role": "model", "parts": parts}, "index": 0}
    if reason is not None:
        out["finishReason"] = reason
    return out


class ContentCollector:
    """The answer's parts in the order the model wrote them, consecutive text (or thought) in one part."""

    def __init__(self, model: str, *, include_thoughts: bool) -> None:
        self.id = response_id()
        self.model = model
        self.include_thoughts = include_thoughts
        self.parts: list[dict] = []
        self.malformed = False

    def add(self, step: Step) -> None:
        if step.deltas:
            dispatch(step.deltas, self)

    def _text(self, text: str, thought: bool) -> None:
        if not text:
            return
        last = self.parts[-1] if self.parts else None
        if last is not None and "text" in last and bool(last.get("thought")) == thought:
            last["text"] += text
        else:
            self.parts.append({"text": text, "thought": True} if thought else {"text": text})

    # DeltaHandler: the answer, gathered.

    def text(self, delta: TextDelta) -> None:
        self._text(delta["text"], False)

    def thinking(self, delta: ThinkingDelta) -> None:
        if self.include_thoughts:
            self._text(delta["text"], True)

    def tool_call(self, delta: ToolCallDelta) -> None:
        self.parts.append(call_part(delta))

    def unparsed_call(self, delta: UnparsedCallDelta) -> None:
        self.malformed = True  # its text follows as a text delta

    def body(self, generation: Generation) -> dict:
        return {"candidates": [candidate(self.parts, finish_reason(generation, self.malformed))],
                "usageMetadata": usage(generation), "modelVersion": self.model, "responseId": self.id}

