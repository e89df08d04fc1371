"""Channel deltas → Chat Completions: chunk events for a stream (unnamed: the API names none), one
JSON object otherwise.

Reasoning goes out under the field or fields the client reads (reasoning.py), a custom tool's call
as OpenAI's custom call (custom_tools.py). Chunks are assembled from a preformatted prefix, so the
per-token cost is one JSON encoding of the new text.
"""

from __future__ import annotations

import time

from looptrace.backends.events import TokenEvent
from looptrace.common.jsonio import dumps
from looptrace.families.base import CONTENT, new_id
from looptrace.families.deltas import TextDelta, ThinkingDelta, ToolCallDelta, UnparsedCallDelta, dispatch

from ....engine.generation import Generation
from ....engine.request import Step
from ...errors import APIError
from ...streaming import SSE_KEEPALIVE, Event, each
from .custom_tools import answer_call
from .reasoning import BOTH

KEEPALIVE = SSE_KEEPALIVE  # what fills a chat stream's silences: SSE's comment (the API has no event for it)


class LogprobEntries:
    """Logprob entries in OpenAI's shape; built only when the client asked for logprobs. `as_ids`:
    vLLM's return_tokens_as_token_ids, each token written "token_id:N"."""

    def __init__(self, tokenizer, top: int, as_ids: bool = False) -> None:
        self.tokenizer = tokenizer
        self.top = top
        self.as_ids = as_ids

    def _token(self, token_id: int) -> str:
        return f"token_id:{token_id}" if self.as_ids else self.tokenizer.decode([token_id])

    def entry(self, event: TokenEvent) -> dict:
        token = self._token(event["id"])
        entry = {"token": token, "logprob": event["logprob"], "bytes": list(token.encode("utf-8")), "top_logprobs": []}
        for token_id, logprob in list(zip(event["top_ids"], event["top_logprobs"]))[: self.top]:
            text = self._token(token_id)
            entry["top_logprobs"].append({"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))})
        return entry


def usage(generation: Generation) -> dict:
    return {
        "prompt_tokens": generation.prompt_tokens,
        "completion_tokens": generation.completion_tokens,
        "total_tokens": generation.prompt_tokens + generation.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": generation.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": generation.reasoning_tokens},
    }


def tool_call_json(delta: ToolCallDelta, custom: frozenset[str] = frozenset()) -> dict:
    if delta["name"] in custom:
        return answer_call(delta["id"], delta["name"], delta["arguments"])
    return {"id": delta["id"], "type": "function", "function": {"name": delta["name"], "arguments": delta["arguments"]}}


class ChatStream:
    """`token_ids`: vLLM's return_token_ids. The prompt's ids go in the first chunk, each chunk's choice
    carries the ids of the tokens since the last (a token that makes no text waits for the next chunk),
    and logprobs cover every token (reasoning and calls too), so the two line up as vLLM's do."""

    def __init__(self, model: str, *, include_usage: bool, logprobs: LogprobEntries | None,
                 service_tier: str = "default",
                 token_ids: bool = False, reasoning_fields: tuple[str, ...] = BOTH,
                 custom_tools: frozenset[str] = frozenset()) -> None:
        self.id = new_id("chatcmpl-")
        self.reasoning_fields = reasoning_fields
        self.custom_tools = custom_tools
        self.created = int(time.time())
        self.model = model
        self.include_usage = include_usage
        self.service_tier = service_tier
        self.logprobs = logprobs
        self._head = f'{{"id":"{self.id}","object":"chat.completion.chunk","created":{self.created},"model":{dumps(model)},"service_tier":{dumps(self.service_tier)},"choices":[{{"index":0,"delta":'
        self._pending_logprobs: list[dict] = []
        self._ids: list[int] | None = [] if token_ids else None  # ids since the last chunk

    def _chunk(self, delta: dict | str, finish_reason: str | None = None, logprobs: list | None = None,
               top: str = "", ids: bool = True) -> Event:
        body = delta if isinstance(delta, str) else dumps(delta)
        if self._ids is not None and logprobs is None and self._pending_logprobs:
            logprobs, self._pending_logprobs = self._pending_logprobs, []
        tail_logprobs = "null" if logprobs is None else dumps({"content": logprobs})
        tail_finish = "null" if finish_reason is None else f'"{finish_reason}"'
        token_ids = ""
        if self._ids is not None and ids:
            token_ids, self._ids = f',"token_ids":{dumps(self._ids)}', []
        return None, (f'{self._head}{body},"logprobs":{tail_logprobs},"finish_reason":{tail_finish}{token_ids}}}]'
                      f'{top}}}').encode()

    name = "chat"
    ends_with_done = True

    def start(self, generation: Generation | None = None) -> list[Event]:
        top = f',"prompt_token_ids":{dumps(generation.prompt_ids)}' if self._ids is not None and generation else ""
        # As vLLM's: the opening chunk's choice has no token_ids (its ids are the prompt's, beside it).
        return [self._chunk('{"role":"assistant","content":""}', top=top, ids=False)]

    def frames(self, step: Step) -> list[Event]:
        token = step.token
        if token is not None:
            if self._ids is not None:
                self._ids.append(token["id"])
                if self.logprobs is not None:
                    self._pending_logprobs.append(self.logprobs.entry(token))
            elif self.logprobs is not None and step.channel == CONTENT:
                self._pending_logprobs.append(self.logprobs.entry(token))
        return each(dispatch(step.deltas, self)) if step.deltas else []

    # DeltaHandler: each delta's chunk.

    def text(self, delta: TextDelta) -> list[Event]:
        logprobs, self._pending_logprobs = (self._pending_logprobs or None), []
        return [self._chunk('{"content":' + dumps(delta["text"]) + "}", logprobs=logprobs)]

    def thinking(self, delta: ThinkingDelta) -> list[Event]:
        text = dumps(delta["text"])
        return [self._chunk("{" + ",".join(f'"{field}":{text}' for field in self.reasoning_fields) + "}")]

    def tool_call(self, delta: ToolCallDelta) -> list[Event]:
        # Every fragment carries index, id, type and name: strict clients reject one that doesn't.
        call = tool_call_json(delta, self.custom_tools)
        call["index"] = delta["index"]
        return [self._chunk({"tool_calls": [call]})]

    def unparsed_call(self, delta: UnparsedCallDelta) -> list[Event]:
        return []  # its text follows as a text delta

    def finish(self, generation: Generation) -> list[Event]:
        logprobs = self._pending_logprobs or None
        out = [self._chunk("{}", generation.finish_reason, logprobs=logprobs)]
        if self.include_usage:
            out.append((None, f'{{"id":"{self.id}","object":"chat.completion.chunk","created":{self.created},'
                              f'"model":{dumps(self.model)},"choices":[],"usage":{dumps(usage(generation))}}}'.encode()))
        return out

    def failed(self, error: APIError, generation: Generation) -> list[Event]:
        return [(None, dumps(error.body()).encode())]

    def keepalive(self) -> list[Event]:
        return []  # SSE's comment (KEEPALIVE)


class ChatCollector:
    """Accumulates a whole answer for a non-streaming response."""

    service_tier = "default"  # the tier the answer names: the route sets the one asked

    def __init__(self, model: str, logprobs: LogprobEntries | None, token_ids: bool = False,
                 reasoning_fields: tuple[str, ...] = BOTH, custom_tools: frozenset[str] = frozenset()) -> None:
        self.model = model
        self.reasoning_fields = reasoning_fields
        self.custom_tools = custom_tools
        self.logprobs = logprobs
        self.ids: list[int] | None = [] if token_ids else None  # vLLM's return_token_ids: every token's id
        self.texts: list[str] = []
        self.reasoning: list[str] = []
        self.calls: list[dict] = []
        self.entries: list[dict] = []

    def add(self, step: Step) -> None:
        if step.token is not None and self.ids is not None:
            self.ids.append(step.token["id"])
            if self.logprobs is not None:  # every token's, as vLLM gives them with the ids
                self.entries.append(self.logprobs.entry(step.token))
        elif self.logprobs is not None and step.channel == CONTENT:
            self.entries.append(self.logprobs.entry(step.token))
        dispatch(step.deltas, self)

    # DeltaHandler: the answer, gathered.

    def text(self, delta: TextDelta) -> None:
        self.texts.append(delta["text"])

    def thinking(self, delta: ThinkingDelta) -> None:
        self.reasoning.append(delta["text"])

    def tool_call(self, delta: ToolCallDelta) -> None:
        self.calls.append(tool_call_json(delta, self.custom_tools))

    def unparsed_call(self, delta: UnparsedCallDelta) -> None:
        return None  # its text follows as a text delta

    def body(self, generation: Generation) -> dict:
        text = "".join(self.texts)
        message: dict = {"role": "assistant", "content": text if text or not self.calls else None}
        if self.reasoning:
            reasoning = "".join(self.reasoning)
            for field in self.reasoning_fields:
                message[field] = reasoning
        if self.calls:
            message["tool_calls"] = self.calls
        answer = {
            "id": new_id("chatcmpl-"),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "service_tier": self.service_tier,
            "choices": [{
                "index": 0,
                "message": message,
                "logprobs": {"content": self.entries} if self.logprobs is not None else None,
                "finish_reason": generation.finish_reason,
            }],
            "usage": usage(generation),
        }
        if self.ids is not None:
            answer["choices"][0]["token_ids"] = self.ids
            answer["prompt_token_ids"] = generation.prompt_ids
        return answer
