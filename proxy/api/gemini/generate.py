"""POST /v1beta/models/{model}:generateContent, :streamGenerateContent and :countTokens (the Gemini
API, which Gemini CLI and the google-genai SDK speak). Errors on these routes leave in Google's shape
(errors.py).

The path's model names the model asked for, and any name is served by this server's one model (the
answer's `modelVersion` says which): Gemini CLI asks under several names in one session. The trace
keeps both: the served model as every surface's (`gen_ai.request.model`, which forks and replays
read), the name asked beside it; and what the request asked for that nothing here acts on (a
response MIME type and schema, a thinking budget or level).
"""

from __future__ import annotations

from aiohttp import web

from looptrace.common import attributes as attr
from looptrace.common.jsonio import dumps

from ...observe.telemetry import RequestTelemetry
from ..keys import RUNTIME
from ..serving import collected, prepared, streamed, traced
from ..validation import json_body
from .answer import ContentCollector
from .json_array import JsonArray
from .request import GeminiOptions, parse_count, parse_generate
from .stream import ContentStream

MAX_RECORDED_CHARS = 256  # of a model name or MIME type the client wrote: recorded, never trusted


async def served_model(request: web.Request) -> str:
    runtime = request.app[RUNTIME]
    await runtime.ready()
    return runtime.model_name


async def generate_content(request: web.Request) -> web.Response:
    return await _generate(request, stream=False)


async def stream_generate_content(request: web.Request) -> web.StreamResponse:
    return await _generate(request, stream=True)


async def _generate(request: web.Request, *, stream: bool) -> web.StreamResponse:
    async with traced(request, attr.ENDPOINT_GEMINI, _recorded(attr.REQUEST_MODEL_ASKED,
                                                               request.match_info["model"])) as trace:
        body = await json_body(request)
        generation_request, options = parse_generate(body)
        _asked(trace, options)
        model = await served_model(request)
        generation = await prepared(request, trace, body, generation_request, model=model, stream=stream)
        shown = {"include_thoughts": options.include_thoughts}
        if not stream:
            return await collected(trace, generation, ContentCollector(model, **shown))
        fmt = ContentStream(model, **shown)
        # ?alt=sse is what the SDK and Gemini CLI ask for; without it Google sends one JSON array.
        if request.query.get("alt") == "sse":
            return await streamed(request, trace, generation, fmt)
        array = JsonArray(request)
        await streamed(request, trace, generation, fmt, array)
        return array.response


def _recorded(name: str, value: str | None) -> dict:
    """{name: value} for a string the client wrote, cut short; {} for none, or one that is not printable."""
    return {name: value[:MAX_RECORDED_CHARS]} if value and value.isprintable() else {}


def _asked(trace: RequestTelemetry, options: GeminiOptions) -> None:
    """What the request asked for and nothing here acts on, on its trace: the schema (the client's own
    text, as a tool's definitions are) only where content is recorded."""
    attributes = _recorded(attr.REQUEST_RESPONSE_MIME_TYPE, options.response_mime_type)
    if options.thinking_budget is not None:
        attributes[attr.REQUEST_THINKING_BUDGET] = options.thinking_budget
    if options.thinking_level is not None:
        attributes[attr.REQUEST_THINKING_LEVEL] = options.thinking_level
    schema = options.response_schema
    trace.asked(attributes, {attr.REQUEST_RESPONSE_SCHEMA: dumps(schema)} if schema is not None else None)


async def count_tokens(request: web.Request) -> web.Response:
    """The prompt's tokens as the model would read them: rendered with the template (and tools, where
    a generateContentRequest brings them), images included. Not traced: nothing is generated."""
    body = await json_body(request)
    generation_request = parse_count(body)
    generation = await prepared(request, None, body, generation_request, model=await served_model(request),
                                stream=False)
    return web.json_response({"totalTokens": generation.prompt_tokens})
