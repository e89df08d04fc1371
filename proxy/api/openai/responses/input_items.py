"""GET /v1/responses/{id}/input_items: the items a stored response's model read, as a page of a list."""

from __future__ import annotations

from aiohttp import web

from ...errors import invalid
from .store import responses_of

ID_PREFIXES = {"message": "msg_", "function_call": "fc_", "function_call_output": "fco_", "reasoning": "rs_",
               "custom_tool_call": "ctc_", "custom_tool_call_output": "ctco_", "compaction": "cmp_"}


async def input_items(request: web.Request) -> web.Response:
    """The items the model read for a stored response (its conversation before its output: a previous
    response's turns included), each with an id, as a page of a list."""
    response_id = request.match_info["response_id"]
    store = responses_of(request)
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
