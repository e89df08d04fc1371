"""Recent responses, kept in memory so a request can continue one by `previous_response_id`, and a
client can read one back (`GET /v1/responses/{id}`) or delete it.

Bounded by count and by bytes, oldest out first: it is a convenience for clients that use it, not a
database (codex sends `store: false` and its whole conversation every time). A response's size is
its conversation's and its own, as JSON; a stored conversation shares its items with the one it
continued, so that count is an upper bound of the memory a chain holds.
Like everything in one process, another looptrace instance behind the same balancer does not see it.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

from aiohttp import web

from looptrace.common.jsonio import dumps

from ..errors import APIError

DEFAULT_MAX_RESPONSES = 256
DEFAULT_MAX_BYTES = 64 << 20  # 64 MiB: 300 responses with a 1 MiB field each once held 241 MiB


class Stored(NamedTuple):
    items: list  # the conversation so far: the request's items, then the response's output
    response: dict  # the response object as the client received it
    size: int  # bytes, as JSON: the conversation and the response


class ResponseStore:
    def __init__(self, max_responses: int = DEFAULT_MAX_RESPONSES, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_responses, self.max_bytes = max_responses, max_bytes
        self._stored: OrderedDict[str, Stored] = OrderedDict()
        self.held_bytes = 0

    def put(self, response: dict, items: list) -> None:
        """Keeps the response, and the conversation as it continues with its output; one larger than
        the whole bound is not kept (reading it back is the 404 of one forgotten)."""
        conversation = items + response["output"]
        size = len(dumps(conversation)) + len(dumps(response))
        if size > self.max_bytes:
            return
        self._stored[response["id"]] = Stored(conversation, response, size)
        self.held_bytes += size
        while len(self._stored) > self.max_responses or self.held_bytes > self.max_bytes:
            self.held_bytes -= self._stored.popitem(last=False)[1].size

    def conversation(self, response_id: str) -> list:
        stored = self._stored.get(response_id)
        if stored is None:
            raise APIError(404, f"Previous response with id '{response_id}' not found.",
                           param="previous_response_id", code="previous_response_not_found")
        return stored.items

    def response(self, response_id: str) -> dict:
        stored = self._stored.get(response_id)
        if stored is None:
            raise _not_found(response_id)
        return stored.response

    def delete(self, response_id: str) -> None:
        stored = self._stored.pop(response_id, None)
        if stored is None:
            raise _not_found(response_id)
        self.held_bytes -= stored.size

    def __len__(self) -> int:
        return len(self._stored)


def _not_found(response_id: str) -> APIError:
    # Responses stream with store=false, and anything older than the last `max_responses`, are not kept.
    return APIError(404, f"Response with id '{response_id}' not found. This server keeps the last responses "
                    f"created with store=true, in memory: {DEFAULT_MAX_RESPONSES} of them, "
                    f"{DEFAULT_MAX_BYTES >> 20} MiB in all.", param="response_id", code="response_not_found")


RESPONSE_STORE: web.AppKey[ResponseStore] = web.AppKey("response_store", ResponseStore)
