"""The responses this process is running, by id, so that `POST /v1/responses/{id}/cancel` can stop one.

Held in this process's memory: a response runs where its request arrived, and its generation can be
stopped only there. With `--workers N` (or several machines) a cancel that lands on another process
finds the response neither running there nor finished, and says so (a 404 naming this process): the
workers share their trace store, not their running generations.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from ...auth import within

if TYPE_CHECKING:
    from ....engine.generation import Generation
    from .stream import ResponseBuilder


class Running:
    def __init__(self) -> None:
        self._by_id: dict[str, tuple[ResponseBuilder, Generation]] = {}

    # Each response is found by its tenant and id: another tenant's running response is not there to it.
    def started(self, builder: ResponseBuilder, generation: Generation, tenant: str | None = None) -> None:
        self._by_id[within(tenant, builder.id)] = (builder, generation)

    def ended(self, response_id: str, tenant: str | None = None) -> None:
        self._by_id.pop(within(tenant, response_id), None)

    def cancel(self, response_id: str, tenant: str | None = None) -> dict | None:
        """Stops the response's generation before its next token; its answer (or stream) ends as
        `cancelled`. The response object as it stands, or None when it is not running here."""
        found = self._by_id.get(within(tenant, response_id))
        if found is None:
            return None
        builder, generation = found
        builder.cancelled = True
        generation.cancel()
        return {**builder.response(), "status": "cancelled"}

    def __len__(self) -> int:
        return len(self._by_id)


RUNNING: web.AppKey[Running] = web.AppKey("running_responses", Running)
