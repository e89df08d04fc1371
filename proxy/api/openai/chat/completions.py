"""POST /v1/chat/completions."""

from __future__ import annotations

from contextlib import aclosing

from aiohttp import web

from looptrace.common import attributes as attr

from ...keys import RUNTIME
from ...serving import prepared, traced
from ...streaming import relay
from ...validation import json_body
from .request import parse_chat
from .response import ChatCollector, ChatStream, LogprobEntries


async def chat_completions(request: web.Request) -> web.StreamResponse:
    async with traced(request, attr.ENDPOINT_CHAT) as trace:
        body = await json_body(request)
        generation_request, options = parse_chat(body)
        generation = await prepared(request, trace, body, generation_request, model=options.model,
                                    stream=options.stream)
        tokenizer = request.app[RUNTIME].tokenizer
        texts = LogprobEntries(tokenizer, generation_request.top_logprobs or 0, options.tokens_as_ids) \
            if options.logprobs else None
        try:
            if options.stream:
                stream = ChatStream(options.model, include_usage=options.include_usage, logprobs=texts,
                                    service_tier=options.service_tier,
                                    token_ids=options.token_ids, reasoning_fields=options.reasoning_fields,
                                    custom_tools=options.custom_tools)
                trace.responded(stream.id)
                return await relay(request, generation, stream, trace)
            collector = ChatCollector(options.model, texts, options.token_ids, options.reasoning_fields,
                                      options.custom_tools)
            collector.service_tier = options.service_tier
            async with aclosing(generation.run()) as steps:
                async for step in steps:
                    collector.add(step)
            answer = collector.body(generation)
            trace.responded(answer["id"])
            return web.json_response(answer)
        finally:
            generation.cancel()  # a client that went away stops its generation
