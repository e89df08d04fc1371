"""Compactions run: a Responses request whose last input item is a `compaction_trigger` (codex's remote
compaction), one whose prompt passes its `context_management` threshold (compacted first, in a step of
its own), and `POST /v1/responses/compact` (the Open Responses specification's CompactResource).

Each compaction is a step of its own in the trace: its request span says so (looptrace.compaction: how
it was asked for, the summary's id, how many items it replaces), and it is counted
(looptrace_compactions_total). Requests whose input holds compaction items say how many they expanded.
"""

from __future__ import annotations

from contextlib import aclosing
from typing import NamedTuple

from aiohttp import web

from looptrace.common import attributes as attr
from looptrace.families.base import new_id

from .....engine.generation import Generation
from .....engine.request import GenerationRequest
from .....observe.telemetry import RequestTelemetry
from ....errors import APIError
from ....keys import RUNTIME
from ....auth import tenant_of
from ....protocol import parse
from ....serving import prepared, traced
from ....validation import json_body
from ..default_model import with_model
from ..protocol import Compaction, CompactionTrigger, Message, ResponsesRequest
from ..request import Previous, ResponsesOptions, ToolNames, converted
from ..store import responses_of
from ..stream import ResponseBuilder
from . import plan as compaction
from .answer import AfterCompaction, CompactionBuilder
from .plan import TRIGGER, Plan
from .summaries import SUMMARIES


class First(NamedTuple):
    """A compaction made before a request's answer (context_management)."""

    item: dict  # the compaction item: the answer's first output item
    request: GenerationRequest  # the request, its conversation compacted: what the model answers
    names: ToolNames


async def planned(http: web.Request, trace: RequestTelemetry, body: ResponsesRequest,
                  previous: Previous | None) -> tuple[Plan, GenerationRequest, ResponsesOptions, ToolNames]:
    """A Responses request converted, its compaction items expanded (a 400 for one that cannot be)."""
    plan = await compaction.plan(http, body, previous)
    if plan.summaries:
        trace.expanded(len(plan.summaries))
    request, options, names = converted(body, previous, plan)
    if plan.trigger is not None and request.tool_choice not in ("auto", "none"):
        request.tool_choice = "auto"  # a call forced would leave no room for the summary, which is text
    return plan, request, options, names


def builder_for(http: web.Request, plan: Plan, first: First | None, options: ResponsesOptions, names: ToolNames,
                conversation: str | None, stream: bool | None = None) -> ResponseBuilder:
    """What formats the answer: one compaction item (a trigger), the compaction item then the answer (a
    request compacted first), or an ordinary response. `stream`: streamed whatever the body says (a
    transport that always streams); None: as it says."""
    args = (options.model, names, options.echo)
    kwargs = {"stream": options.stream if stream is None else stream, "token_messages": options.token_messages}
    if plan.trigger is not None:
        return CompactionBuilder(*args, summaries=http.app[SUMMARIES], conversation=conversation,
                                 tenant=tenant_of(http), **kwargs)
    if first is not None:
        return AfterCompaction(*args, compaction=first.item, **kwargs)
    return ResponseBuilder(*args, **kwargs)


async def kept(builder: ResponseBuilder, trace: RequestTelemetry, plan: Plan, how: str = "trigger") -> None:
    """A compaction's summary kept, and its step marked: before the client hears the end."""
    if isinstance(builder, CompactionBuilder) and builder.reference is not None:
        await builder.keep(trace.trace_id)
        trace.compacted(how, builder.summary_id, plan.replaced)
    elif plan.client:
        trace.compacted("client", None, plan.replaced)


# -- context_management: compacted first, when the prompt is past the threshold --

async def first(http: web.Request, raw: dict, body: ResponsesRequest, previous: Previous | None, plan: Plan,
                options: ResponsesOptions) -> First | None:
    """With context_management, the compaction made before the answer when the rendered prompt passes the
    threshold (counted by rendering it once, untraced: the price of asking for it); None otherwise. `raw`
    is the body as the client sent it (who is calling: serving.prepared)."""
    if not plan.thresholded or plan.trigger is not None:
        return None
    runtime = http.app[RUNTIME]
    await runtime.ready()
    counting, _, _ = converted(body, previous, plan)  # prepared anew for the answer: nothing shared
    counted = await prepared(http, None, raw, counting, model=options.model, stream=False)
    limit = plan.limit(runtime.max_model_len)
    if limit is None or len(counted.prompt_ids) <= limit:
        return None
    async with traced(http, attr.ENDPOINT_RESPONSES) as trace:
        made = await _summarized(http, trace, raw, _asking(body), previous, "threshold")
    item = made.output[0]
    plan.summaries[item["encrypted_content"]] = made.summary
    given = Compaction(type=item["type"], encrypted_content=item["encrypted_content"])
    compacted, _, names = converted(body.model_copy(update={"input": [*body.items, given]}), previous, plan)
    return First(item, compacted, names)


def _asking(body: ResponsesRequest) -> ResponsesRequest:
    """The request as a compaction of itself: its input then a trigger, answered whole, kept nowhere."""
    return body.model_copy(update={"input": [*body.items, CompactionTrigger(type=TRIGGER)], "stream": False,
                                   "store": False})


async def _summarized(http: web.Request, trace: RequestTelemetry, raw: dict, body: ResponsesRequest,
                      previous: Previous | None, how: str) -> CompactionBuilder:
    """A compaction run whole (not streamed) in `trace`, its summary kept: what its builder made."""
    plan, request, options, names = await planned(http, trace, body, previous)
    generation = await prepared(http, trace, raw, request, model=options.model, stream=False)
    builder = builder_for(http, plan, None, options, names, request.conversation)
    trace.responded(builder.id)
    await _run(generation, builder)
    if builder.reference is None:  # failed: no summary to keep (one cut by its token budget is kept)
        said = builder.error.message if builder.error is not None else None
        raise APIError(500, said or "The compaction did not complete.", type="server_error",
                       code="compaction_failed")
    await kept(builder, trace, plan, how)
    return builder


async def _run(generation: Generation, builder: ResponseBuilder) -> None:
    try:
        async with aclosing(generation.run()) as steps:
            async for step in steps:
                builder.frames(step)
        builder.finish(generation)
    finally:
        generation.cancel()


# -- POST /v1/responses/compact --

async def compact_response(http: web.Request) -> web.Response:
    """The conversation compacted: the user's messages and one compaction item (CompactResource)."""
    async with traced(http, attr.ENDPOINT_RESPONSES_COMPACT) as trace:
        raw = await json_body(http)
        body = parse(ResponsesRequest, raw)
        store = responses_of(http)
        previous = Previous.of(await store.conversation(body.previous_response_id)) \
            if body.previous_response_id else None
        body = await with_model(http, body)
        made = await _summarized(http, trace, raw, _asking(body), previous, "compact")
        # The window a compaction leaves: the user's messages, then the compaction item.
        earlier = previous.items if previous is not None else []
        users = [_user_message(item) for item in [*earlier, *body.items]
                 if isinstance(item, Message) and item.role == "user"]
        return web.json_response({"id": made.id, "object": "response.compaction", "output": [*users, made.output[0]],
                                  "created_at": made.created_at, "usage": made.final["usage"]})


def _user_message(item: Message) -> dict:
    """A user's input message as an output item (the specification's Message: id, status, content parts)."""
    content = item.content
    parts = [{"type": "input_text", "text": content}] if isinstance(content, str) else \
        [part.model_dump(exclude_unset=True) for part in content or ()]
    return {"type": "message", "id": item.id or new_id("msg_"), "status": "completed",
            "role": "user", "content": parts}
