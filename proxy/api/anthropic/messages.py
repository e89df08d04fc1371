"""POST /v1/messages (Anthropic's Messages API, which Claude Code speaks) and
POST /v1/messages/count_tokens. Errors on these routes leave in Anthropic's shape (errors.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import aclosing

from aiohttp import web

from looptrace.backends.base import BackendError
from looptrace.common import attributes as attr

from ...engine.generation import Generation
from ...observe.telemetry import RequestTelemetry
from .. import streaming
from ..errors import APIError, api_error, model_not_found
from ..keys import RUNTIME
from ..media_fetch import fetch_media
from ..serving import prepared, traced
from ..streaming import END, FrameWriter, opened_stream
from ..validation import json_body
from .answer import MessageCollector
from .request import parse_messages
from .stream import MessageStream, error_event

log = logging.getLogger("looptrace")


async def create_message(request: web.Request) -> web.StreamResponse:
    async with traced(request, attr.ENDPOINT_MESSAGES) as trace:
        body = await json_body(request)
        generation_request, options = parse_messages(body)
        generation = await prepared(request, trace, body, generation_request, model=options.model,
                                    stream=options.stream)
        try:
            if options.stream:
                stream = MessageStream(options.model)
                trace.responded(stream.id)
                return await _stream(request, generation, stream, trace)
            collector = MessageCollector(options.model)
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
    runtime = request.app[RUNTIME]
    await runtime.ready()
    if options.model != runtime.model_name:
        raise model_not_found(options.model, runtime.model_name)
    settings = runtime.settings
    await fetch_media(generation_request.media, frozenset(h.lower() for h in settings.allowed_media_domains),
                      runtime.media_limits, settings.media_fetch_timeout)
    generation = Generation(runtime, generation_request)
    await generation.prepare()
    return web.json_response({"input_tokens": generation.prompt_tokens})


async def _stream(request: web.Request, generation: Generation, stream: MessageStream,
                  trace: RequestTelemetry) -> web.StreamResponse:
    bound = generation.runtime.settings.stream_write_timeout  # for a client that stops reading
    async with opened_stream(request, generation.run(), bound) as (response, steps, first, out):
        await out.opening(stream.start(generation), first)
        pacer = asyncio.create_task(_keep_alive(out, stream))  # a ping after every silent interval
        try:
            step = await first
            if step is not END:
                await out.write_now(stream.frames(step.deltas))
                async for step in steps:
                    frames = stream.frames(step.deltas)
                    if frames:
                        await out.write(frames)
            end = stream.finish(generation)
        except BackendError as err:
            # Too late for a status code: the error goes in the stream, where Anthropic's SDK raises it.
            trace.stream_failed(err.code)
            end = error_event(api_error(err).anthropic_body())
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception as exc:  # noqa: BLE001 - the stream is open: the error must end it in the API's shape
            log.exception("messages stream failed")
            trace.stream_failed("internal_error")
            end = error_event(APIError(500, f"internal error: {type(exc).__name__}: {exc}").anthropic_body())
        finally:
            pacer.cancel()
        await out.write(end)
        await out.flush()
        return response


async def _keep_alive(out: FrameWriter, stream: MessageStream) -> None:
    while True:
        wait = stream.last_sent + streaming.KEEPALIVE_SECONDS - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
            continue
        try:
            await out.write(stream.keepalive())
        except ConnectionError:
            return  # the client left; the handler is being cancelled too
