"""What a family's parser makes of the generated text: channel deltas, built here and nowhere else.

Plain dicts with a `type` (as backends/events.py makes events), so the per-token path allocates one
small dict per delta; typed, so readers know each kind's fields:

    text                the answer's words
    thinking            reasoning
    tool_call           a whole call, once its closing marker arrived: arguments as a JSON object
                        string, typed by the tool's schema; `raw` the model's own markup for it
    tool_call_unparsed  markup that opened a call but is not one: counted, and its text follows as a
                        `text` delta (never dropped)

Every consumer (the engine, each API's stream and answer) is a DeltaHandler and goes through
`dispatch`, the one place that switches on a delta's type.
"""

from __future__ import annotations

from typing import Generic, Literal, Protocol, TypedDict, TypeVar


class TextDelta(TypedDict):
    type: Literal["text"]
    text: str


class ThinkingDelta(TypedDict):
    type: Literal["thinking"]
    text: str


class ToolCallDelta(TypedDict):
    type: Literal["tool_call"]
    index: int  # the call's place among this answer's calls
    id: str  # "call_…", random (several looptrace processes may serve one conversation)
    name: str
    arguments: str  # a JSON object
    raw: str  # the model's own markup for this call, markers included
    outcome: str  # "valid" | "invalid_args" | "unknown_tool"


class UnparsedCallDelta(TypedDict):
    type: Literal["tool_call_unparsed"]
    raw: str


Delta = TextDelta | ThinkingDelta | ToolCallDelta | UnparsedCallDelta


def text_delta(text: str) -> TextDelta:
    return {"type": "text", "text": text}


def thinking_delta(text: str) -> ThinkingDelta:
    return {"type": "thinking", "text": text}


def tool_call_delta(index: int, call_id: str, name: str, arguments: str, raw: str, outcome: str) -> ToolCallDelta:
    return {"type": "tool_call", "index": index, "id": call_id, "name": name, "arguments": arguments, "raw": raw,
            "outcome": outcome}


def unparsed_call_delta(raw: str) -> UnparsedCallDelta:
    return {"type": "tool_call_unparsed", "raw": raw}


R = TypeVar("R", covariant=True)


class DeltaHandler(Protocol, Generic[R]):
    """One method per kind of delta; what each returns is the consumer's (SSE frames, a kept delta)."""

    def text(self, delta: TextDelta) -> R: ...
    def thinking(self, delta: ThinkingDelta) -> R: ...
    def tool_call(self, delta: ToolCallDelta) -> R: ...
    def unparsed_call(self, delta: UnparsedCallDelta) -> R: ...


_METHODS = {"text": "text", "thinking": "thinking", "tool_call": "tool_call", "tool_call_unparsed": "unparsed_call"}


def dispatch(deltas: list[Delta], handler: DeltaHandler[R]) -> list[R]:
    """Each delta to the handler's method for its kind, in order; what they return, in order."""
    return [getattr(handler, _METHODS[delta["type"]])(delta) for delta in deltas]
