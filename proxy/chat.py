"""POST /v1/chat/completions."""

from __future__ import annotations

import asyncio
from contextlib import aclosing

from aiohttp import web

from backends.base import BackendError

from . import streaming
from ._validate import json_body
from .chat_request import parse_chat
from .chat_response import ChatCollector, ChatStream, TokenTexts, error_frame
from .errors import APIError, model_not_found
from .generation import Generation
from .keys import RUNTIME, TELEMETRY
from .request_trace import RequestTrace
from .streaming import END, SSE_HEADERS, first_step, wait_before_opening
from .telemetry import conversation_id

KEEPALIVE = b": keepalive\n\n"  # an SSE comment: every client's parser skips it


async def chat_completions(request: web.Request) -> web.StreamResponse:
    async with request.app[TELEMETRY].request(request, "chat") as trace:
        return await _chat(request, trace)


async def _chat(request: web.Request, trace: RequestTrace) -> web.StreamResponse:
    runtime = request.app[RUNTIME]
    body = await json_body(request)
    generation_request, options = parse_chat(body)
    trace.requested(options.model, stream=options.stream, conversation=conversation_id(request.headers, body))
    await runtime.ready()
    if options.model != runtime.model_name:
        raise model_not_found(options.model, runtime.model_name)

    generation = Generation(runtime, generation_request, observer=trace)
    await generation.prepare()
    texts = TokenTexts(runtime.tokenizer, generation_request.top_logprobs or 0) if options.logprobs else None
    try:
        if options.stream:
            stream = ChatStream(runtime.model_name, include_usage=options.include_usage, logprobs=texts)
            trace.responded(stream.id)
            return await _stream(request, generation, stream, trace)
        collector = ChatCollector(runtime.model_name, texts)
        async with aclosing(generation.run()) as steps:
            async for event, deltas in steps:
                collector.add(event, deltas)
        body = collector.body(generation)
        trace.responded(body["id"])
        return web.json_response(body)
    except BackendError as err:
        raise APIError(err.status, err.message, type="server_error" if err.status >= 500 else "invalid_request_error",
                       code=err.code) from err
    finally:
        generation.cancel()  # a client that went away stops its generation


async def _stream(request: web.Request, generation: Generation, stream: ChatStream,
                  trace: RequestTrace) -> web.StreamResponse:
    async with aclosing(generation.run()) as steps, first_step(steps) as first:
        await wait_before_opening(first)
        response = web.StreamResponse(headers=SSE_HEADERS)
        await response.prepare(request)
        await response.write(stream.start())
        try:
            # Until the first token: a comment every interval (after it, tokens keep the stream busy).
            while not first.done():
                await asyncio.wait({first}, timeout=streaming.KEEPALIVE_SECONDS)
                if not first.done():
                    await response.write(KEEPALIVE)
            step = first.result()
            if step is not END:
                await response.write(stream.frames(*step))
                async for event, deltas in steps:
                    frame = stream.frames(event, deltas)
                    if frame:
                        await response.write(frame)
            await response.write(stream.finish(generation))
        except BackendError as err:
            # Too late for a status code: the error goes in the stream, where the openai SDK raises it.
            trace.stream_failed(err.code)
            await response.write(error_frame(APIError(err.status, err.message, type="server_error", code=err.code).body()))
        return response
