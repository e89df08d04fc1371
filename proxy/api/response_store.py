"""Recent responses, kept in memory so a request can continue one by `previous_response_id`, and a
client can read one back (`GET /v1/responses/{id}`) or delete it.

Bounded by count, oldest out first: it is a convenience for clients that use it, not a database
(codex sends `store: false` and its whole conversation every time). A stored conversation shares
its items with the one it continued, so a long chain costs one list of references per response.
Like everything in one process, another looptrace instance behind the same balancer does not see it.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

from .errors import APIError

DEFAULT_MAX_RESPONSES = 256


class Stored(NamedTuple):
    items: list  # the conversation so far: the request's items, then the response's output
    response: dict  # the response object as the client received it


class ResponseStore:
    def __init__(self, max_responses: int = DEFAULT_MAX_RESPONSES) -> None:
        self.max_responses = max_responses
        self._stored: OrderedDict[str, Stored] = OrderedDict()

    def put(self, response: dict, items: list) -> None:
        """Keeps the response, and the conversation as it continues with its output."""
        self._stored[response["id"]] = Stored(items + response["output"], response)
        while len(self._stored) > self.max_responses:
            self._stored.popitem(last=False)

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
        if self._stored.pop(response_id, None) is None:
            raise _not_found(response_id)

    def __len__(self) -> int:
        return len(self._stored)


def _not_found(response_id: str) -> APIError:
    # Responses stream with store=false, and anything older than the last `max_responses`, are not kept.
    return APIError(404, f"Response with id '{response_id}' not found. This server keeps the last responses "
                    "created with store=true, in memory.", param="response_id", code="response_not_found")
