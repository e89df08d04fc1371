"""GET /v1/responses/{id}/input_items: the items a stored response's model read, as a page of a list."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, field_validator

from ...errors import invalid
from ...query import Query
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
    query = InputItemsQuery.of(request)
    if query.order == "desc":
        items.reverse()
    if query.after is not None:
        at = next((i for i, item in enumerate(items) if item["id"] == query.after), None)
        if at is None:
            raise invalid(f"No input item '{query.after}' in response '{response_id}'.", param="after")
        items = items[at + 1:]
    page = items[:query.limit]
    return web.json_response({"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                              "last_id": page[-1]["id"] if page else None, "has_more": len(items) > query.limit})


class InputItemsQuery(Query):
    """?limit= (1 to 100) &order= (asc, desc) &after= (an item's id), in OpenAI's words."""

    limit: int = 20
    order: str = "desc"
    after: str | None = None

    @field_validator("limit", mode="before")
    @classmethod
    def _limit(cls, value: str) -> int:
        if not value.isdigit() or not 1 <= int(value) <= 100:
            raise invalid("Invalid value for 'limit': expected an integer from 1 to 100.", param="limit")
        return int(value)

    @field_validator("order")
    @classmethod
    def _order(cls, order: str) -> str:
        if order not in ("asc", "desc"):
            raise invalid("Invalid value for 'order': expected 'asc' or 'desc'.", param="order")
        return order


class _Stored(BaseModel):
    """What listing reads of a stored item; the rest of it is listed as it was stored."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    type: Any = None
    role: Any = None
    content: Any = None


def listed(item: dict, response_id: str, index: int) -> dict:
    """An input item as the API lists it: with an id (one made from the response's and its place when
    the client sent none), and a message's text as content parts."""
    stored = _Stored.model_validate(item)
    kind = stored.type if "type" in item else "message" if "role" in item else "item"
    out = {"type": kind, **item}
    out.setdefault("id", f"{ID_PREFIXES.get(kind, 'item_')}{response_id.removeprefix('resp_')}_{index}")
    if kind == "message":
        part = "output_text" if stored.role == "assistant" else "input_text"
        if isinstance(stored.content, str):
            out["content"] = [{"type": part, "text": stored.content}]
        if part == "output_text":
            out["content"] = [{"annotations": [], **p} if isinstance(p, dict) and p.get("type") == "output_text"
                              else p for p in out["content"] or ()]
        out.setdefault("status", "completed")
    elif kind in ("function_call", "function_call_output", "custom_tool_call"):
        out.setdefault("status", "completed")
    return out
