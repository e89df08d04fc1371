"""Channel deltas → Gemini's stream: a GenerateContentResponse per step, each holding what the step
added (text, a thought, a whole function call), and a last one with the finishReason and the
usageMetadata, which Gemini CLI needs on every stream (it fails a turn that ends without one).

Its events are unnamed (SSE `data:` lines only, no `[DONE]`), as Google sends them with `?alt=sse`;
without it the same objects go out as one JSON array (json_array.py). A failure after the stream
began is Google's error object as its last event. Text deltas are the per-token path: their JSON is
a prefix and a suffix made once and one JSON encoding of the new text.
"""

from __future__ import annotations

from looptrace.common.jsonio import dumps
from looptrace.families.deltas import TextDelta, ThinkingDelta, ToolCallDelta, UnparsedCallDelta, dispatch

from ...engine.generation import Generation
from ...engine.request import Step
from ..errors import APIError
from ..streaming import Event, each
from .answer import call_part, candidate, finish_reason, response_id, usage
from .errors import google_body


class ContentStream:
    """Gemini's streamed responses: a StreamFormat (api/streaming.py)."""

    name = "gemini"
    ends_with_done = False

    def __init__(self, model: str, *, include_thoughts: bool) -> None:
        self.id = response_id()
        self.model = model
        self.include_thoughts = include_thoughts
        self.malformed = False
        self._tail = dumps({"modelVersion": model, "responseId": self.id})[1:]  # `"modelVersion":…}`
        self._head = '{"candidates":[{"content":{"role":"model","parts":[{"text":'
        self._text_end = f'}}]}},"index":0}}],{self._tail}'
        self._thought_end = f',"thought":true}}]}},"index":0}}],{self._tail}'

    def _event(self, body: dict) -> Event:
        return None, (dumps(body)[:-1] + "," + self._tail).encode()

    def start(self, generation: Generation) -> list[Event]:
        return []  # Google's stream opens with its first content

    def keepalive(self) -> list[Event]:
        return []  # the transport's own: an SSE comment, or JSON's whitespace

    def failed(self, error: APIError, generation: Generation) -> list[Event]:
        return [(None, dumps(google_body(error)).encode())]

    def frames(self, step: Step) -> list[Event]:
        deltas = step.deltas
        return each(dispatch(deltas, self)) if deltas else []

    # DeltaHandler: each delta's events.

    def text(self, delta: TextDelta) -> list[Event]:
        text = delta["text"]
        return [(None, f"{self._head}{dumps(text)}{self._text_end}".encode())] if text else []

    def thinking(self, delta: ThinkingDelta) -> list[Event]:
        text = delta["text"]
        if not text or not self.include_thoughts:
            return []
        return [(None, f"{self._head}{dumps(text)}{self._thought_end}".encode())]

    def tool_call(self, delta: ToolCallDelta) -> list[Event]:
        return [self._event({"candidates": [candidate([call_part(delta)])]})]

    def unparsed_call(self, delta: UnparsedCallDelta) -> list[Event]:
        self.malformed = True
        return []  # its text follows as a text delta

    def finish(self, generation: Generation) -> list[Event]:
        """The last response: an empty text part (as Google's last one has), the reason, the usage."""
        last = candidate([{"text": ""}], finish_reason(generation, self.malformed))
        return [self._event({"candidates": [last], "usageMetadata": usage(generation)})]
