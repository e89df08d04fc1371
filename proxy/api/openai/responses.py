"""/v1/responses: the Responses API, which codex speaks (and only it)."""

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
from ..serving import prepared, traced
from .response_store import RESPONSE_STORE
from .responses_request import parse_responses
from .responses_stream import ResponseBuilder
from ..streaming import END, FrameWriter, opened_stream
from ..validation import field, json_body

log = logging.getLogger("looptrace")


async def create_response(request: web.Request) -> web.StreamResponse:
    async with traced(request, attr.ENDPOINT_RESPONSES) as trace:
        store = request.app[RESPONSE_STORE]
        body = await json_body(request)
        previous_id = field(body, "previous_response_id", str, "previous_response_id")
        previous = await store.conversation(previous_id) if previous_id else None
        generation_request, options, names = parse_responses(body, previous)
        generation = await prepared(request, trace, body, generation_request, model=options.model,
                                    stream=options.stream)
        builder = ResponseBuilder(options.model, names, options.echo, stream=options.stream)
        trace.responded(builder.id)

        async def keep() -> None:
            # Before the client hears the end: its next turn may name this response at once, on any process.
            if options.store and builder.status in ("completed", "incomplete"):
                await store.put(builder.final, options.items)

        try:
            if options.stream:
                response = await _stream(request, generation, builder, trace, keep)
            else:
                async with aclosing(generation.run()) as steps:
                    async for step in steps:
                        builder.add(step.deltas)
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


async def _stream(request: web.Request, generation: Generation, builder: ResponseBuilder,
                  trace: RequestTelemetry, keep) -> web.StreamResponse:
    bound = generation.runtime.settings.stream_write_timeout  # for a client that stops reading
    async with opened_stream(request, generation.run(), bound) as (response, steps, first, out):
        await _relay(steps, first, out, builder, generation, trace, keep)
        return response


async def _relay(steps, first: asyncio.Future, out: FrameWriter, builder: ResponseBuilder, generation: Generation,
                 trace: RequestTelemetry, keep) -> None:
    await out.opening(builder.start(), first)
    # `response.in_progress` after every interval of silence, for the whole stream.
    pacer = asyncio.create_task(_keep_alive(out, builder))
    try:
        step = await first
        if step is not END:
            await out.write_now(builder.add(step.deltas))
            async for step in steps:
                frames = builder.add(step.deltas)
                if frames:
                    await out.write(frames)
        end = builder.finish(generation)
    except BackendError as err:
        trace.stream_failed(err.code)
        end = builder.failed(err.status, err.message, generation)
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as exc:  # noqa: BLE001 - the stream is open: the error must end it in the API's shape
        log.exception("responses stream failed")
        trace.stream_failed("internal_error")
        end = builder.failed(500, f"internal error: {type(exc).__name__}: {exc}", generation)
    finally:
        pacer.cancel()
    await keep()
    await out.write(end)
    await out.flush()


async def _keep_alive(out: FrameWriter, builder: ResponseBuilder) -> None:
    while True:
        wait = builder.last_sent + streaming.KEEPALIVE_SECONDS - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
            continue
        try:
            await out.write(builder.keepalive())
        except ConnectionError:
            return  # the client left; the handler is being cancelled too
