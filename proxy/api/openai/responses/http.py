"""/v1/responses: the Responses API, which codex speaks (and only it); `respond` is one response's
run, whichever transport brought its request (an HTTP POST here, a WebSocket message: websocket.py)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import aclosing

from aiohttp import web

from looptrace.common import attributes as attr

from ....observe.telemetry import RequestTelemetry
from ...serving import prepared, traced
from ...streaming import relay
from ...auth import tenant_of
from ...protocol import parse
from ...validation import json_body
from .compaction import run as compact
from .default_model import with_model
from .protocol import ResponsesRequest
from .request import Previous
from .store import responses_of
from .running import RUNNING


async def create_response(request: web.Request) -> web.StreamResponse:
    async with traced(request, attr.ENDPOINT_RESPONSES) as trace:
        raw = await json_body(request)
        body = parse(ResponsesRequest, raw)
        previous = await responses_of(request).conversation(body.previous_response_id) \
            if body.previous_response_id else None
        body = await with_model(request, body)
        return await respond(request, trace, raw, body, Previous.of(previous))


async def respond(request: web.Request, trace: RequestTelemetry, raw: dict, body: ResponsesRequest,
                  previous: Previous | None, *, sink=None, conversation: str | None = None,
                  kept: Callable[[dict, list], None] | None = None) -> web.StreamResponse:
    """One response: `body` is its request (`raw`, as the client sent it), `previous` the conversation it
    continues. With `sink` (a WebSocket's) it is streamed there, whatever `stream` says; `conversation`
    names it when the client does not; `kept` is told of the response once it ended as answers do (a
    WebSocket keeps its lane's last one). Compaction (compaction/run.py) on either transport: its items
    expanded, a trigger answered with one compaction item, context_management's compaction made first."""
    store = responses_of(request)
    plan, generation_request, options, names = await compact.planned(request, trace, body, previous)
    first = await compact.first(request, raw, body, previous, plan, options)  # context_management
    if first is not None:
        generation_request, names = first.request, first.names
    stream = options.stream or sink is not None
    generation = await prepared(request, trace, raw, generation_request, model=options.model, stream=stream,
                                conversation=conversation)
    builder = compact.builder_for(request, plan, first, options, names, generation_request.conversation,
                                  stream=stream)
    trace.responded(builder.id)

    async def keep() -> None:
        # Before the client hears the end: its next turn may name this response at once, on any process.
        await compact.kept(builder, trace, plan)
        if builder.status in ("completed", "incomplete"):
            if options.store:
                await store.put(builder.final, options.items)
            if kept is not None:
                kept(builder.final, options.items)

    running = request.app[RUNNING]
    tenant = tenant_of(request)
    running.started(builder, generation, tenant)
    try:
        if stream:
            response = await relay(request, generation, builder, trace, keep, sink)
        else:
            async with aclosing(generation.run()) as steps:
                async for step in steps:
                    builder.frames(step)
            builder.finish(generation)
            await keep()
            response = web.json_response(builder.final)
    finally:
        running.ended(builder.id, tenant)
        generation.cancel()  # a client that went away stops its generation
    return response


async def get_response(request: web.Request) -> web.Response:
    return web.json_response(await responses_of(request).response(request.match_info["response_id"]))


async def delete_response(request: web.Request) -> web.Response:
    response_id = request.match_info["response_id"]
    await responses_of(request).delete(response_id)
    return web.json_response({"id": response_id, "object": "response", "deleted": True})
