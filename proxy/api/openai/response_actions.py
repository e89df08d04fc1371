"""What else the Responses API does with a response: count a request's input tokens
(`POST /v1/responses/input_tokens`), list a stored response's input items
(`GET /v1/responses/{id}/input_items`), and cancel a running one (`POST /v1/responses/{id}/cancel`)."""

from __future__ import annotations

from aiohttp import web

from ..errors import APIError, invalid
from ..serving import prepared
from ..validation import field, json_body
from . import compaction
from .response_store import RESPONSE_STORE
from .responses_request import parse_responses
from .running import RUNNING

ID_PREFIXES = {"message": "msg_", "function_call": "fc_", "function_call_output": "fco_", "reasoning": "rs_",
               "custom_tool_call": "ctc_", "custom_tool_call_output": "ctco_", "compaction": "cmp_"}


async def input_tokens(request: web.Request) -> web.Response:
    """The prompt a `POST /v1/responses` body would give the model, counted as the model reads it
    (rendered with the template, tools and thinking; images counted), nothing generated or traced."""
    body = await json_body(request)
    previous_id = field(body, "previous_response_id", str, "previous_response_id")
    previous = await request.app[RESPONSE_STORE].conversation(previous_id) if previous_id else None
    # Compaction items counted as the summaries the model reads for them.
    generation_request, options, _ = parse_responses(body, previous, await compaction.plan(request, body, previous))
    generation = await prepared(request, None, body, generation_request, model=options.model, stream=False)
    return web.json_response({"object": "response.input_tokens", "input_tokens": generation.prompt_tokens})


async def cancel_response(request: web.Request) -> web.Response:
    response_id = request.match_info["response_id"]
    cancelled = request.app[RUNNING].cancel(response_id)
    if cancelled is not None:
        return web.json_response(cancelled)
    stored = await _stored(request, response_id)
    if stored is not None:
        raise invalid(f"Response '{response_id}' is {stored.get('status')}: only a running response can be "
                      "cancelled.", param="response_id", code="response_not_running")
    raise APIError(404, f"No response '{response_id}' is running in this process, nor stored. With --workers (or "
                   "several servers) a cancel must reach the process that runs the response: running generations "
                   "are not shared, stored responses are.", param="response_id", code="response_not_found")


async def _stored(request: web.Request, response_id: str) -> dict | None:
    try:
        return await request.app[RESPONSE_STORE].response(response_id)
    except APIError as err:
        if err.status == 404:
            return None
        raise


async def input_items(request: web.Request) -> web.Response:
    """The items the model read for a stored response (its conversation before its output: a previous
    response's turns included), each with an id, as a page of a list."""
    response_id = request.match_info["response_id"]
    store = request.app[RESPONSE_STORE]
    response = await store.response(response_id)
    conversation = await store.conversation(response_id)
    items = [listed(item, response_id, i) for i, item in
             enumerate(conversation[:len(conversation) - len(response.get("output") or ())])]
    query = request.query
    limit = _number(query.get("limit", "20"), "limit", 1, 100)
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise invalid("Invalid value for 'order': expected 'asc' or 'desc'.", param="order")
    if order == "desc":
        items.reverse()
    after = query.get("after")
    if after is not None:
        at = next((i for i, item in enumerate(items) if item["id"] == after), None)
        if at is None:
            raise invalid(f"No input item '{after}' in response '{response_id}'.", param="after")
        items = items[at + 1:]
    page = items[:limit]
    return web.json_response({"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                              "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit})


def _number(value: str, name: str, low: int, high: int) -> int:
    if not value.isdigit() or not low <= int(value) <= high:
        raise invalid(f"Invalid value for '{name}': expected an integer from {low} to {high}.", param=name)
    return int(value)


def listed(item: dict, response_id: str, index: int) -> dict:
    """An input item as the API lists it: with an id (one made from the response's and its place when
    the client sent none), and a message's text as content parts."""
    kind = item.get("type", "message" if "role" in item else "item")
    out = {"type": kind, **item}
    out.setdefault("id", f"{ID_PREFIXES.get(kind, 'item_')}{response_id.removeprefix('resp_')}_{index}")
    if kind == "message":
        part = "output_text" if out.get("role") == "assistant" else "input_text"
        content = out.get("content")
        if isinstance(content, str):
            out["content"] = [{"type": part, "text": content}]
        if part == "output_text":
            out["content"] = [{"annotations": [], **p} if isinstance(p, dict) and p.get("type") == "output_text"
                              else p for p in out["content"] or ()]
        out.setdefault("status", "completed")
    elif kind in ("function_call", "function_call_output", "custom_tool_call"):
        out.setdefault("status", "completed")
    return out
