"""A Responses request without `model`: the codex desktop app leaves it out of follow-up turns (OpenAI
answers them with the previous response's model). It takes the model of the response it continues
(`previous_response_id`), else the one model this server serves; only where neither is there (no
previous response, and a key that may use no model served here) is it OpenAI's 400 for the missing
parameter. The request is a copy of the parsed one with `model` filled in, so everything after reads it
as if the client had sent it.
"""

from __future__ import annotations

from aiohttp import web

from ...auth import caller_of
from ...errors import invalid
from ...keys import RUNTIME
from .protocol import ResponsesRequest
from .store import responses_of


async def with_model(http: web.Request, body: ResponsesRequest, previous_model: str | None = None) -> ResponsesRequest:
    """`body` with its model: as sent, the previous response's (`previous_model` where the caller
    already holds it: a socket's own responses), or the served one."""
    if body.model is not None:
        return body
    model = previous_model
    if model is None and body.previous_response_id is not None:
        stored = await responses_of(http).response(body.previous_response_id)
        model = stored.get("model")
        model = model if isinstance(model, str) else None
    if model is None:
        runtime = http.app[RUNTIME]
        await runtime.ready()
        if caller_of(http).may_use(runtime.model_name):
            model = runtime.model_name
    if model is None:
        raise invalid("Missing required parameter: 'model'.", param="model", code="missing_required_parameter")
    return body.model_copy(update={"model": model})
