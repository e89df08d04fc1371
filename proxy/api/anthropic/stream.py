"""Channel deltas → Anthropic's event stream.

    message_start, ping
    content_block_start / content_block_delta … / content_block_stop   per block, in the model's order:
        thinking (thinking_delta …, then signature_delta), text (text_delta …),
        tool_use (one input_json_delta: a call is parsed whole before it is sent)
    message_delta (stop_reason, stop_sequence, usage), message_stop

`ping` also fills every silence of a keepalive interval, and an `error` event ends a stream that
failed after it began. Each event is named by its type (SSE's `event:` line). Text and thinking
deltas are the per-token path: their JSON is a prefix made once per block and one JSON encoding of
the new text.
"""

from __future__ import annotations

from looptrace.common.jsonio import dumps
from looptrace.families.deltas import TextDelta, ThinkingDelta, ToolCallDelta, UnparsedCallDelta, dispatch

from ...engine.generation import Generation
from ...engine.request import Step
from ..errors import APIError
from ..streaming import Event, each
from .answer import message_id, signature, stop_reason, tool_input, tool_use_block, usage
from .errors import anthropic_body

PING: Event = ("ping", b'{"type":"ping"}')
_DELTA_FIELD = {"text": "text_delta", "thinking": "thinking_delta"}


def event(kind: str, payload: dict) -> Event:
    return kind, dumps({"type": kind, **payload}).encode()


def error_event(body: dict) -> Event:
    """An error after the stream began: Anthropic's `error` event, which its SDK raises from."""
    return "error", dumps(body).encode()


class MessageStream:
    """Anthropic's message events: a StreamFormat (api/streaming.py)."""

    name = "messages"
    ends_with_done = False  # its stream ends with message_stop

    def __init__(self, model: str, *, token_ids: bool = False, thinking_shown: bool = True,
                 applied_edits: list[dict] | None = None) -> None:
        self.id = message_id()
        self.model = model
        self._ids: list[int] | None = [] if token_ids else None  # return_token_ids: every token's id
        self._thinking_shown = thinking_shown  # False: display "omitted", thinking blocks sent without text
        self._applied_edits = applied_edits  # said in message_delta, as Anthropic says it
        self._index = -1  # the open block's, or the last one's
        self._open: str | None = None  # the open block's type
        self._thinking: list[str] = []  # the open thinking block's text, for its signature
        self._head = ""  # the open block's delta event's JSON up to its text

    def start(self, generation: Generation) -> list[Event]:
        """The prompt's usage is said here once, as the prefill found it when the first token came
        with the stream's opening (a vLLM server's cache hits, told only at the end, count as input):
        message_delta then carries output_tokens alone, so no client can add two splits together."""
        message = {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
                   "stop_reason": None, "stop_sequence": None, "usage": {**usage(generation), "output_tokens": 0}}
        if self._ids is not None:
            message["prompt_token_ids"] = generation.prompt_ids
        return [event("message_start", {"message": message}), PING]

    def keepalive(self) -> list[Event]:
        return [PING]

    def failed(self, error: APIError, generation: Generation) -> list[Event]:
        return [error_event(anthropic_body(error))]

    def frames(self, step: Step) -> list[Event]:
        if self._ids is not None and step.token is not None:
            self._ids.append(step.token["id"])
        deltas = step.deltas
        return each(dispatch(deltas, self)) if deltas else []

    # DeltaHandler: each delta's events.

    def text(self, delta: TextDelta) -> list[Event]:
        return self._text("text", delta["text"])

    def thinking(self, delta: ThinkingDelta) -> list[Event]:
        return self._text("thinking", delta["text"])

    def tool_call(self, delta: ToolCallDelta) -> list[Event]:
        closed = self._close()
        self._index += 1
        where = {"index": self._index}
        return [*closed, event("content_block_start", {**where, "content_block": tool_use_block(delta, {})}),
                event("content_block_delta", {**where, "delta": {"type": "input_json_delta",
                                                                 "partial_json": _compact(delta)}}),
                event("content_block_stop", where)]

    def unparsed_call(self, delta: UnparsedCallDelta) -> list[Event]:
        return []  # its text follows as a text delta

    def _text(self, kind: str, text: str) -> list[Event]:
        if not text:
            return []
        opened = []
        if self._open != kind:
            opened = [*self._close(), self._start(kind)]
        if kind == "thinking":
            self._thinking.append(text)
            if not self._thinking_shown:
                return opened  # the block opens and closes with its signature; its text is not sent
        opened.append(("content_block_delta", f"{self._head}{dumps(text)}}}}}".encode()))
        return opened

    def _start(self, kind: str) -> Event:
        self._index += 1
        self._open = kind
        block = {"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking" else {"type": "text",
                                                                                                "text": ""}
        self._head = (f'{{"type":"content_block_delta","index":{self._index},'
                      f'"delta":{{"type":"{_DELTA_FIELD[kind]}","{kind}":')
        return event("content_block_start", {"index": self._index, "content_block": block})

    def _close(self) -> list[Event]:
        if self._open is None:
            return []
        out = []
        if self._open == "thinking":
            mark = {"type": "signature_delta", "signature": signature("".join(self._thinking))}
            out.append(event("content_block_delta", {"index": self._index, "delta": mark}))
            self._thinking = []
        self._open = None
        out.append(event("content_block_stop", {"index": self._index}))
        return out

    def finish(self, generation: Generation) -> list[Event]:
        reason, sequence = stop_reason(generation)
        delta = {"delta": {"stop_reason": reason, "stop_sequence": sequence},
                 "usage": {"output_tokens": generation.completion_tokens}}
        if self._applied_edits is not None:
            delta["context_management"] = {"applied_edits": self._applied_edits}
        if self._ids is not None:  # the answer's ids once, whole: a block's deltas are text, not tokens
            delta["token_ids"] = self._ids
        return [*self._close(), event("message_delta", delta), event("message_stop", {})]


def _compact(delta: ToolCallDelta) -> str:
    """The call's input as the JSON text a client accumulates and parses (the object tool_use holds)."""
    return dumps(tool_input(delta))
