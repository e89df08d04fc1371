"""POST /v1/chat/completions."""

from __future__ import annotations

import asyncio
import logging
from contextlib import aclosing

from aiohttp import web

from looptrace.backends.base import BackendError
from looptrace.common import attributes as attr

from ...engine.generation import Generation
from ...observe.telemetry import RequestTelemetry
from .. import streaming
from .chat_request import parse_chat
from .chat_response import ChatCollector, ChatStream, LogprobEntries, error_frame
from ..errors import APIError, api_error
from ..serving import prepared, traced
from ..keys import RUNTIME
from ..streaming import END, opened_stream
from ..validation import json_body

log = logging.getLogger("looptrace")
KEEPALIVE = b": keepalive\n\n"  # an SSE comment: every client's parser skips it


async def chat_completions(request: web.Request) -> web.StreamResponse:
    async with traced(request, attr.ENDPOINT_CHAT) as trace:
        body = await json_body(request)
        generation_request, options = parse_chat(body)
        generation = await prepared(request, trace, body, generation_request, model=options.model,
                                    stream=options.stream)
        tokenizer = request.app[RUNTIME].tokenizer
        texts = LogprobEntries(tokenizer, generation_request.top_logprobs or 0) if options.logprobs else None
        try:
            if options.stream:
                stream = ChatStream(options.model, include_usage=options.include_usage, logprobs=texts)
                trace.responded(stream.id)
                return await _stream(request, generation, stream, trace)
            collector = ChatCollector(options.model, texts)
            async with aclosing(generation.run()) as steps:
                async for step in steps:
                    collector.add(step)
            answer = collector.body(generation)
            trace.responded(answer["id"])
            return web.json_response(answer)
        finally:
            generation.cancel()  # a client that went away stops its generation


async def _stream(request: web.Request, generation: Generation, stream: ChatStream,
                  trace: RequestTelemetry) -> web.StreamResponse:
    bound = generation.runtime.settings.stream_write_timeout  # for a client that stops reading
    async with opened_stream(request, generation.run(), bound) as (response, steps, first, out):
        await out.opening(stream.start(), first)
        try:
            # Until the first token: a comment every interval (after it, tokens keep the stream busy).
            while not first.done():
                await asyncio.wait({first}, timeout=streaming.KEEPALIVE_SECONDS)
                if not first.done():
                    await out.write(KEEPALIVE)
            step = first.result()
            if step is not END:
                await out.write_now(stream.frames(step))
                async for step in steps:
                    frame = stream.frames(step)
                    if frame:
                        await out.write(frame)
            await out.write(stream.finish(generation))
        except BackendError as err:
            # Too late for a status code: the error goes in the stream, where the openai SDK raises it.
            trace.stream_failed(err.code)
            await out.write(error_frame(api_error(err).body()))
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception as exc:  # noqa: BLE001 - the stream is open: the error must end it in the API's shape
            log.exception("chat stream failed")
            trace.stream_failed("internal_error")
            await out.write(error_frame(APIError(500, f"internal error: {type(exc).__name__}: {exc}",
                                                 type="server_error", code="internal_error").body()))
        await out.flush()
        return response
