"""What both generating endpoints (/v1/chat/completions, /v1/responses) do around their own formats:
trace the request from arrival to end, check the model, and prepare the generation, so that every
refusal leaves before a byte of the answer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web
from opentelemetry.propagate import extract

from ..engine.generation import Generation
from ..engine.request import GenerationRequest
from ..observe.telemetry import RequestTelemetry
from .clients import conversation_id, request_attributes
from .errors import failure_of, model_not_found
from .keys import RUNTIME, TELEMETRY
from .media_fetch import fetch_media


@asynccontextmanager
async def traced(http: web.Request, endpoint: str) -> AsyncIterator[RequestTelemetry]:
    """The request's trace and metrics, for as long as its handler runs; an incoming traceparent is continued."""
    trace = http.app[TELEMETRY].start_request(endpoint, extract(http.headers),
                                              request_attributes(http.method, http.path, http.headers))
    try:
        yield trace
    except BaseException as exc:
        trace.fail(*failure_of(exc))
        raise
    finally:
        trace.end()


async def prepared(http: web.Request, trace: RequestTelemetry, body: dict, request: GenerationRequest, *, model: str,
                   stream: bool) -> Generation:
    """The generation, rendered and checked against the context: ready to run."""
    request.conversation = conversation_id(http.headers, body)
    trace.requested(model, stream=stream, conversation=request.conversation)
    runtime = http.app[RUNTIME]
    await runtime.ready()
    if model != runtime.model_name:
        raise model_not_found(model, runtime.model_name)
    trace.checked()
    settings = runtime.settings
    await fetch_media(request.media, frozenset(h.lower() for h in settings.allowed_media_domains),
                      runtime.media_limits, settings.media_fetch_timeout)
    generation = Generation(runtime, request, trace.observers)
    await generation.prepare()
    return generation
