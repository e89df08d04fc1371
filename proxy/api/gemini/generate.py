"""POST /v1beta/models/{model}:generateContent, :streamGenerateContent and :countTokens (the Gemini
API, which Gemini CLI and the google-genai SDK speak). Errors on these routes leave in Google's shape
(errors.py).

The path's model names the model asked for, and any name is served by this server's one model (the
answer's `modelVersion` says which): Gemini CLI asks under several names in one session.
"""

from __future__ import annotations

from contextlib import aclosing

from aiohttp import web

from looptrace.common import attributes as attr

from ..keys import RUNTIME
from ..serving import prepared, traced
from ..streaming import relay
from ..validation import json_body
from .answer import ContentCollector
from .json_array import JsonArray
from .request import parse_count, parse_generate
from .stream import ContentStream


async def served_model(request: web.Request) -> str:
    runtime = request.app[RUNTIME]
    await runtime.ready()
    return runtime.model_name


async def generate_content(request: web.Request) -> web.Response:
    return await _generate(request, stream=False)


async def stream_generate_content(request: web.Request) -> web.StreamResponse:
    return await _generate(request, stream=True)


async def _generate(request: web.Request, *, stream: bool) -> web.StreamResponse:
    async with traced(request, attr.ENDPOINT_GEMINI) as trace:
        body = await json_body(request)
        generation_request, options = parse_generate(body)
        model = await served_model(request)
        generation = await prepared(request, trace, body, generation_request, model=model, stream=stream)
        try:
            if stream:
                fmt = ContentStream(model, include_thoughts=options.include_thoughts)
                trace.responded(fmt.id)
                # ?alt=sse is what the SDK and Gemini CLI ask for; without it Google sends one JSON array.
                if request.query.get("alt") == "sse":
                    return await relay(request, generation, fmt, trace)
                array = JsonArray(request)
                await relay(request, generation, fmt, trace, sink=array)
                return array.response
            collector = ContentCollector(model, include_thoughts=options.include_thoughts)
            async with aclosing(generation.run()) as steps:
                async for step in steps:
                    collector.add(step)
            trace.responded(collector.id)
            return web.json_response(collector.body(generation))
        finally:
            generation.cancel()  # a client that went away stops its generation


async def count_tokens(request: web.Request) -> web.Response:
    """The prompt's tokens as the model would read them: rendered with the template (and tools, where
    a generateContentRequest brings them), images included. Not traced: nothing is generated."""
    body = await json_body(request)
    generation_request = parse_count(body)
    generation = await prepared(request, None, body, generation_request, model=await served_model(request),
                                stream=False)
    return web.json_response({"totalTokens": generation.prompt_tokens})
