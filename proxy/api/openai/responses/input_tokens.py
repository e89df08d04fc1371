"""POST /v1/responses/input_tokens: the input tokens a Responses request would give the model."""

from __future__ import annotations

from aiohttp import web

from ...protocol import parse
from ...serving import prepared
from ...validation import json_body
from .compaction import plan as compaction
from .default_model import with_model
from .protocol import ResponsesRequest
from .request import Previous, converted
from .store import responses_of


async def input_tokens(request: web.Request) -> web.Response:
    """The prompt a `POST /v1/responses` body would give the model, counted as the model reads it
    (rendered with the template, tools and thinking; images counted), nothing generated or traced."""
    raw = await json_body(request)
    body = parse(ResponsesRequest, raw)
    previous = Previous.of(await responses_of(request).conversation(body.previous_response_id)) \
        if body.previous_response_id else None
    body = await with_model(request, body)
    # Compaction items counted as the summaries the model reads for them.
    generation_request, options, _ = converted(body, previous, await compaction.plan(request, body, previous))
    generation = await prepared(request, None, raw, generation_request, model=options.model, stream=False)
    return web.json_response({"object": "response.input_tokens", "input_tokens": generation.prompt_tokens})
