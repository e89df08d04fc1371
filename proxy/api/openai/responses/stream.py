"""Channel deltas → a Responses object and its event stream.

Output items follow the model: reasoning (`rs_`), then a message (`msg_`), then calls (`fc_` for
functions, `ctc_` for custom tools); an open item is closed before the next one opens. Every event
carries `sequence_number`, and `response.output_item.done` carries the whole item: codex acts on that
event alone, and a call it does not get whole is never run. Each event is named by its type, which
SSE writes in an `event:` line like OpenAI's, though codex and the openai SDK read only `data.type`.

Text deltas are the per-token path: their JSON is assembled from a prefix made once per item, so
each costs one JSON encoding of the new text.
"""

from __future__ import annotations

import json
import time

from looptrace.common.jsonio import dumps
from looptrace.families.base import new_id
from looptrace.families.deltas import Delta, TextDelta, ThinkingDelta, ToolCallDelta, UnparsedCallDelta, dispatch

from ....engine.generation import Generation
from ....engine.request import Step
from ...errors import APIError
from ...streaming import Event, each
from .fields import with_sampling
from .request import ToolNames

REASONING, MESSAGE = "reasoning", "message"


def usage(generation: Generation) -> dict:
    return {
        "input_tokens": generation.prompt_tokens,
        # cache_write_tokens: what the local backend's prefix cache kept of this prompt (0 elsewhere).
        "input_tokens_details": {"cached_tokens": generation.cached_tokens,
                                 "cache_write_tokens": generation.cache_write_tokens},
        "output_tokens": generation.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": generation.reasoning_tokens},
        "total_tokens": generation.prompt_tokens + generation.completion_tokens,
    }


class ResponseBuilder:
    """Builds one response; with `stream` it also returns the events of each step (a StreamFormat:
    api/streaming.py)."""

    name = "responses"
    ends_with_done = True  # the specification's terminal `data: [DONE]` (the openai SDKs stop on it)

    def __init__(self, model: str, names: ToolNames, echo: dict, *, stream: bool, token_messages: bool = False) -> None:
        self.id = new_id("resp_")
        self.names = names
        self.stream = stream
        self.created_at = int(time.time())
        self.head = {"id": self.id, "object": "response", "created_at": self.created_at, "model": model}
        self.echo = echo
        self.output: list[dict] = []
        self.status = "in_progress"
        self.sequence = 0
        self.final: dict | None = None  # the response object, once it ended
        self.error: APIError | None = None  # what ended it, where it failed
        self.cancelled = False  # set by a cancel (running.py): the generation stops, the response ends "cancelled"
        self._item: dict | None = None  # the reasoning or message item being written
        self._index = 0  # its place in the output
        self._texts: list[str] = []
        self._delta_kind = ""  # the open item's delta event
        self._delta_head = ""  # … its JSON up to its sequence number
        self._delta_mid = ""  # … from after the sequence number up to the delta text
        self._ids: list[int] | None = [] if token_messages else None  # every token's id, for output_messages

    # -- events --

    def _event(self, kind: str, payload: dict) -> list[Event]:
        if not self.stream:
            return []
        number = self.sequence
        self.sequence += 1
        return [(kind, dumps({"type": kind, "sequence_number": number, **payload}).encode())]

    def response(self, error: dict | None = None, incomplete: dict | None = None, usage: dict | None = None,
                 completed_at: int | None = None) -> dict:
        return {**self.head, "completed_at": completed_at, "status": self.status, "error": error,
                "incomplete_details": incomplete, "output": self.output, **self.echo, "truncation": "disabled",
                "usage": usage}

    def sampled(self, generation: Generation) -> None:
        """The sampling settings the prepared generation decodes with, echoed from here on."""
        with_sampling(self.echo, generation.sampling)

    def start(self, generation: Generation | None = None) -> list[Event]:
        if generation is not None:
            self.sampled(generation)
        snapshot = self.response()
        return self._event("response.created", {"response": snapshot}) + self._event(
            "response.in_progress", {"response": snapshot})

    def keepalive(self) -> list[Event]:
        """Sent after a silence, so clients and proxies with idle timeouts keep waiting."""
        return self._event("response.in_progress", {"response": self.response()})

    # -- the run --

    def add(self, deltas: list[Delta]) -> list[Event]:
        return each(dispatch(deltas, self)) if deltas else []

    # DeltaHandler: each delta's events.

    def text(self, delta: TextDelta) -> list[Event]:
        return self._text(MESSAGE, delta["text"])

    def thinking(self, delta: ThinkingDelta) -> list[Event]:
        return self._text(REASONING, delta["text"])

    def tool_call(self, delta: ToolCallDelta) -> list[Event]:
        return self._close() + self._call(delta)

    def unparsed_call(self, delta: UnparsedCallDelta) -> list[Event]:
        return []  # its text follows as a text delta

    def _text(self, kind: str, text: str) -> list[Event]:
        if not text:
            return []
        opened = []
        if self._item is None or self._item["type"] != kind:
            opened = self._close() + self._open(kind)
        self._texts.append(text)
        if not self.stream:
            return opened
        number = self.sequence
        self.sequence += 1
        opened.append((self._delta_kind, f"{self._delta_head}{number}{self._delta_mid}{dumps(text)}}}".encode()))
        return opened

    def _open(self, kind: str) -> list[Event]:
        index = len(self.output)
        if kind == REASONING:
            item = {"id": new_id("rs_"), "type": "reasoning", "summary": [], "content": [], "status": "in_progress"}
            part, delta_kind = {"type": "reasoning_text", "text": ""}, "response.reasoning_text.delta"
            extra = ""
        else:
            item = {"id": new_id("msg_"), "type": "message", "status": "in_progress", "role": "assistant", "content": []}
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            delta_kind, extra = "response.output_text.delta", ',"logprobs":[]'
        self.output.append(item)
        self._item, self._index, self._texts = item, index, []
        self._delta_kind = delta_kind
        self._delta_head = f'{{"type":"{delta_kind}","sequence_number":'
        self._delta_mid = f',"item_id":"{item["id"]}","output_index":{index},"content_index":0{extra},"delta":'
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        return (self._event("response.output_item.added", {"output_index": index, "item": dict(item)})
                + self._event("response.content_part.added", {**where, "part": part}))

    def _close(self, status: str = "completed") -> list[Event]:
        item = self._item
        if item is None:
            return []
        self._item = None
        text = "".join(self._texts)
        index = self._index
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        if item["type"] == REASONING:
            part = {"type": "reasoning_text", "text": text}
            done = self._event("response.reasoning_text.done", {**where, "text": text})
        else:
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            done = self._event("response.output_text.done", {**where, "text": text, "logprobs": []})
        item["content"] = [part]
        item["status"] = status
        return (done + self._event("response.content_part.done", {**where, "part": part})
                + self._event("response.output_item.done", {"output_index": index, "item": item}))

    def _call(self, delta: ToolCallDelta) -> list[Event]:
        """A parsed call, reported as the client's tool: a function (its namespace apart) or a custom tool."""
        ref = self.names.resolve(delta["name"])
        index = len(self.output)
        if ref is not None and ref.kind == "custom":
            value = _custom_input(delta["arguments"])
            item = {"id": new_id("ctc_"), "type": "custom_tool_call", "status": "completed",
                    "call_id": delta["id"], "name": ref.name, "input": value}
            field, events = "input", ("response.custom_tool_call_input.delta", "response.custom_tool_call_input.done")
        else:
            value = delta["arguments"]
            item = {"id": new_id("fc_"), "type": "function_call", "status": "completed",
                    "call_id": delta["id"], "name": ref.name if ref else delta["name"], "arguments": value}
            if ref is not None and ref.namespace:
                item["namespace"] = ref.namespace
            field, events = "arguments", ("response.function_call_arguments.delta",
                                          "response.function_call_arguments.done")
        self.output.append(item)
        if not self.stream:
            return []
        where = {"item_id": item["id"], "output_index": index}
        return (self._event("response.output_item.added", {"output_index": index,
                                                           "item": {**item, "status": "in_progress", field: ""}})
                + self._event(events[0], {**where, "delta": value})
                + self._event(events[1], {**where, field: value})
                + self._event("response.output_item.done", {"output_index": index, "item": item}))

    # -- the end --

    def finish(self, generation: Generation) -> list[Event]:
        """`response.completed`, or `response.incomplete` when the token budget ran out; a response
        cancelled (`POST /v1/responses/{id}/cancel`) ends as `cancelled`, with `response.failed`: the
        stream events have none of its own."""
        self.sampled(generation)
        if self.cancelled:
            closed = self._close("incomplete")
            self.status = "cancelled"
            self.final = self.response(usage=usage(generation))
            return closed + self._event("response.failed", {"response": self.final})
        cut = generation.finish_reason == "length"
        closed = self._close("incomplete" if cut else "completed")
        self.status = "incomplete" if cut else "completed"
        body = self.response(incomplete={"reason": "max_output_tokens"} if cut else None, usage=usage(generation),
                             completed_at=None if cut else int(time.time()))
        if self._ids is not None:
            body.update(token_messages(generation, self._ids))
        self.final = body
        return closed + self._event(f"response.{self.status}", {"response": body})

    def without_output(self) -> list[Event]:
        """The end of a response that generates nothing (the WebSocket mode's `generate: false`)."""
        self.status = "completed"
        self.final = self.response(completed_at=int(time.time()))
        return self._event("response.completed", {"response": self.final})

    def frames(self, step: Step) -> list[Event]:
        if self._ids is not None and step.token is not None:
            self._ids.append(step.token["id"])
        return self.add(step.deltas)

    def failed(self, error: APIError, generation: Generation | None = None) -> list[Event]:
        """Too late for an HTTP status: the error ends the stream, where codex shows its message.

        Its code is one of the few the Responses API defines (typed clients refuse others): what the
        HTTP status would have said. The specific one (upstream_error, …) is on the trace's span."""
        self.status, self.error = "failed", error
        status = error.status
        code = "rate_limit_exceeded" if status == 429 else "invalid_prompt" if status < 500 else "server_error"
        body = self.response(error={"code": code, "message": error.message},
                             usage=usage(generation) if generation is not None else None)
        self.final = body
        return self._event("response.failed", {"response": body})


def token_messages(generation: Generation, ids: list[int]) -> dict:
    """vLLM's `enable_response_messages` answer for a model without harmony: the prompt and the answer
    each as one raw message, its text and its ids (vLLM 0.32's ResponseRawMessageAndToken), so a client
    written for vLLM's Responses reads the ids the model read and wrote."""
    rendered = generation.rendered
    prompt = (rendered.text if rendered is not None else "") + generation.forced_text
    answer = generation.runtime.tokenizer.decode(ids, skip_special_tokens=True)
    return {"input_messages": [{"message": prompt, "tokens": generation.prompt_ids, "type": "raw_message_tokens"}],
            "output_messages": [{"message": answer, "tokens": ids, "type": "raw_message_tokens"}]}


def _custom_input(arguments: str) -> str:
    """The free-form input of a custom tool from the function call the model made of it."""
    try:
        args = json.loads(arguments)
    except json.JSONDecodeError:
        return arguments
    if isinstance(args, dict):
        value = args.get("input")
        if isinstance(value, str):
            return value
        if len(args) == 1:  # one parameter under another name: still the whole input
            (only,) = args.values()
            return only if isinstance(only, str) else dumps(only)
    return arguments
