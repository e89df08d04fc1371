"""Recent responses, kept in memory so a request can continue one by `previous_response_id`.

Bounded by count, oldest out first: it is a convenience for clients that use it, not a database
(codex sends `store: false` and its whole conversation every time). A stored conversation shares
its items with the one it continued, so a long chain costs one list of references per response.
Like everything in one process, another looptrace instance behind the same balancer does not see it.
"""

from __future__ import annotations

from collections import OrderedDict

from aiohttp import web

from .errors import APIError

DEFAULT_MAX_RESPONSES = 256


class ResponseStore:
    def __init__(self, max_responses: int = DEFAULT_MAX_RESPONSES) -> None:
        self.max_responses = max_responses
        self._items: OrderedDict[str, list] = OrderedDict()

    def put(self, response_id: str, items: list, output: list) -> None:
        """Keeps the conversation as it continues: the request's items and then the response's output."""
        self._items[response_id] = items + output
        while len(self._items) > self.max_responses:
            self._items.popitem(last=False)

    def conversation(self, response_id: str) -> list:
        items = self._items.get(response_id)
        if items is None:
            raise APIError(404, f"Previous response with id '{response_id}' not found.",
                           param="previous_response_id", code="previous_response_not_found")
        return items

    def __len__(self) -> int:
        return len(self._items)


RESPONSE_STORE: web.AppKey[ResponseStore] = web.AppKey("response_store")
