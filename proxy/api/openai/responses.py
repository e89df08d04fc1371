"""/v1/responses: the Responses API, which codex speaks (and only it)."""

from __future__ import annotations

from contextlib import aclosing

from aiohttp import web

from looptrace.common import attributes as attr

from ..serving import prepared, traced
from ..streaming import relay
from ..validation import field, json_body
from . import compact
from .response_store import RESPONSE_STORE


async def create_response(request: web.Request) -> web.StreamResponse:
    async with traced(request, attr.ENDPOINT_RESPONSES) as trace:
        store = request.app[RESPONSE_STORE]
        body = await json_body(request)
        previous_id = field(body, "previous_response_id", str, "previous_response_id")
        previous = await store.conversation(previous_id) if previous_id else None
        plan, generation_request, options, names = await compact.planned(request, trace, body, previous)
        first = await compact.first(request, body, previous, plan, options)  # context_management
        if first is not None:
            generation_request, names = first.request, first.names
        generation = await prepared(request, trace, body, generation_request, model=options.model,
                                    stream=options.stream)
        builder = compact.builder_for(request, plan, first, options, names, generation_request.conversation)
        trace.responded(builder.id)

        async def keep() -> None:
            # Before the client hears the end: its next turn may name this response at once, on any process.
            await compact.kept(builder, trace, plan)
            if options.store and builder.status in ("completed", "incomplete"):
                await store.put(builder.final, options.items)

        try:
            if options.stream:
                response = await relay(request, generation, builder, trace, keep)
            else:
                async with aclosing(generation.run()) as steps:
                    async for step in steps:
                        builder.frames(step)
                builder.finish(generation)
                await keep()
                response = web.json_response(builder.final)
        finally:
            generation.cancel()  # a client that went away stops its generation
        return response


async def get_response(request: web.Request) -> web.Response:
    return web.json_response(await request.app[RESPONSE_STORE].response(request.match_info["response_id"]))


async def delete_response(request: web.Request) -> web.Response:
    response_id = request.match_info["response_id"]
    await request.app[RESPONSE_STORE].delete(response_id)
    return web.json_response({"id": response_id, "object": "response", "deleted": True})
