"""The responses this process is running, by id, so that `POST /v1/responses/{id}/cancel` can stop one.

Held in this process's memory: a response runs where its request arrived, and its generation can be
stopped only there. With `--workers N` (or several machines) a cancel that lands on another process
finds the response neither running there nor finished, and says so (a 404 naming this process): the
workers share their trace store, not their running generations.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from ....engine.generation import Generation
    from .stream import ResponseBuilder


class Running:
    def __init__(self) -> None:
        self._by_id: dict[str, tuple[ResponseBuilder, Generation]] = {}

    def started(self, builder: ResponseBuilder, generation: Generation) -> None:
        self._by_id[builder.id] = (builder, generation)

    def ended(self, response_id: str) -> None:
        self._by_id.pop(response_id, None)

    def cancel(self, response_id: str) -> dict | None:
        """Stops the response's generation before its next token; its answer (or stream) ends as
        `cancelled`. The response object as it stands, or None when it is not running here."""
        found = self._by_id.get(response_id)
        if found is None:
            return None
        builder, generation = found
        builder.cancelled = True
        generation.cancel()
        return {**builder.response(), "status": "cancelled"}

    def __len__(self) -> int:
        return len(self._by_id)


RUNNING: web.AppKey[Running] = web.AppKey("running_responses", Running)
