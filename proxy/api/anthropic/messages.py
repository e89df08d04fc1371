"""POST /v1/messages (Anthropic's Messages API, which Claude Code speaks) and
POST /v1/messages/count_tokens. Errors on these routes leave in Anthropic's shape (errors.py)."""

from __future__ import annotations

from contextlib import aclosing

from aiohttp import web

from looptrace.common import attributes as attr

from ..serving import prepared, traced
from ..streaming import relay
from ..validation import json_body
from .answer import MessageCollector
from .request import parse_messages
from .stream import MessageStream


async def create_message(request: web.Request) -> web.StreamResponse:
    async with traced(request, attr.ENDPOINT_MESSAGES) as trace:
        body = await json_body(request)
        generation_request, options = parse_messages(body)
        generation = await prepared(request, trace, body, generation_request, model=options.model,
                                    stream=options.stream)
        try:
            if options.stream:
                stream = MessageStream(options.model, token_ids=options.token_ids)
                trace.responded(stream.id)
                return await relay(request, generation, stream, trace)
            collector = MessageCollector(options.model, token_ids=options.token_ids)
            async with aclosing(generation.run()) as steps:
                async for step in steps:
                    collector.add(step)
            trace.responded(collector.id)
            return web.json_response(collector.body(generation))
        finally:
            generation.cancel()  # a client that went away stops its generation


async def count_tokens(request: web.Request) -> web.Response:
    """The prompt's tokens as the model would read them: rendered with the template, tools and
    thinking, images included. Not traced: nothing is generated."""
    body = await json_body(request)
    generation_request, options = parse_messages(body, counting=True)
    generation = await prepared(request, None, body, generation_request, model=options.model, stream=False)
    return web.json_response({"input_tokens": generation.prompt_tokens})
