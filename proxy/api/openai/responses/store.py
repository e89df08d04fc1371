"""Recent responses, kept so a request can continue one by `previous_response_id`, and a client can
read one back (`GET /v1/responses/{id}`) or delete it.

Bounded by count and by bytes, oldest out first: it is a convenience for clients that use it, not a
database (codex sends `store: false` and its whole conversation every time). A response's size is
its conversation's and its own, as JSON; a stored conversation shares its items with the one it
continued, so that count is an upper bound of the memory a chain holds.

`ResponseStore` keeps them in this process's memory (`--trace-db off`). `SharedResponseStore` keeps
them in the trace store's state (trace_store/state.py), so a conversation's next turn may land on any
process serving that store; its own memory keeps what this process stored, which it serves while
the store does not answer (anything else is then a 503 saying why, never a false 404).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

from aiohttp import web

from looptrace.common.jsonio import dumps, loads
from looptrace.trace_store.state import StateStore

from ...auth import tenant_of
from ...errors import APIError

log = logging.getLogger("looptrace")

DEFAULT_MAX_RESPONSES = 256
DEFAULT_MAX_BYTES = 64 << 20  # 64 MiB: 300 responses with a 1 MiB field each once held 241 MiB
WAIT = 5.0  # seconds a request waits for the shared store


class Stored(NamedTuple):
    items: list  # the conversation so far: the request's items, then the response's output
    response: dict  # the response object as the client received it
    size: int  # bytes, as JSON: the conversation and the response


class ResponseStore:
    def __init__(self, max_responses: int = DEFAULT_MAX_RESPONSES, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_responses, self.max_bytes = max_responses, max_bytes
        self._stored: OrderedDict[str, Stored] = OrderedDict()
        self.held_bytes = 0

    async def put(self, response: dict, items: list) -> None:
        """Keeps the response, and the conversation as it continues with its output; one larger than
        the whole bound is not kept (reading it back is the 404 of one forgotten)."""
        self._keep(response, items + response["output"])

    def _keep(self, response: dict, conversation: list, size: int | None = None) -> int:
        size = len(dumps(conversation)) + len(dumps(response)) if size is None else size
        if size > self.max_bytes:
            return size
        old = self._stored.pop(response["id"], None)
        self.held_bytes -= old.size if old else 0
        self._stored[response["id"]] = Stored(conversation, response, size)
        self.held_bytes += size
        while len(self._stored) > self.max_responses or self.held_bytes > self.max_bytes:
            self.held_bytes -= self._stored.popitem(last=False)[1].size
        return size

    async def conversation(self, response_id: str) -> list:
        stored = self._stored.get(response_id)
        if stored is None:
            raise _previous_not_found(response_id)
        return stored.items

    async def response(self, response_id: str) -> dict:
        stored = self._stored.get(response_id)
        if stored is None:
            raise _not_found(response_id)
        return stored.response

    async def delete(self, response_id: str) -> None:
        if not self._forget(response_id):
            raise _not_found(response_id)

    def _forget(self, response_id: str) -> bool:
        stored = self._stored.pop(response_id, None)
        if stored is not None:
            self.held_bytes -= stored.size
        return stored is not None

    def __len__(self) -> int:
        return len(self._stored)

    def close(self) -> None:
        pass


class SharedResponseStore(ResponseStore):
    """In the trace store, for every process serving it; this process's memory as a fallback."""

    def __init__(self, state: StateStore, max_responses: int = DEFAULT_MAX_RESPONSES,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        super().__init__(max_responses, max_bytes)
        self.state = state
        # Threads of its own: a store that hangs holds these, never the ones the server renders on.
        self._threads = ThreadPoolExecutor(2, thread_name_prefix="looptrace-responses")

    async def _call(self, method, *args, **kwargs):
        loop = asyncio.get_running_loop()
        return await asyncio.wait_for(loop.run_in_executor(self._threads, lambda: method(*args, **kwargs)), WAIT)

    async def put(self, response: dict, items: list) -> None:
        conversation = items + response["output"]
        conversation_json, response_json = dumps(conversation), dumps(response)
        size = self._keep(response, conversation, len(conversation_json) + len(response_json))
        if size > self.max_bytes:
            return
        try:
            await self._call(self.state.put_response, response["id"], conversation_json, response_json, size,
                             max_responses=self.max_responses, max_bytes=self.max_bytes)
        except Exception as exc:  # noqa: BLE001 - the answer stands; only another process will miss it
            log.warning("response %s kept in this process only: the store at %s does not answer (%s)",
                        response["id"], self.state.where, str(exc).strip() or type(exc).__name__)

    async def _read(self, response_id: str, part: str):
        try:
            found = await self._call(self.state.get_response, response_id, part)
        except Exception as exc:  # noqa: BLE001 - said below, or served from memory
            stored = self._stored.get(response_id)
            if stored is not None:
                return stored.items if part == "conversation" else stored.response
            raise _unavailable(self.state.where, exc) from exc
        return None if found is None else loads(found)

    async def conversation(self, response_id: str) -> list:
        found = await self._read(response_id, "conversation")
        if found is None:
            raise _previous_not_found(response_id)
        return found

    async def response(self, response_id: str) -> dict:
        found = await self._read(response_id, "response")
        if found is None:
            raise _not_found(response_id)
        return found

    async def delete(self, response_id: str) -> None:
        here = self._forget(response_id)
        try:
            gone = await self._call(self.state.delete_response, response_id)
        except Exception as exc:  # noqa: BLE001 - a delete that may not have happened is not a success
            raise _unavailable(self.state.where, exc) from exc
        if not (gone or here):
            raise _not_found(response_id)

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)


class TenantResponses:
    """The stored responses one tenant may read, continue and delete: kept under ids prefixed by its
    name, so another tenant's id is, to it, an id never stored (the same 404, nothing more)."""

    def __init__(self, store: ResponseStore, tenant: str) -> None:
        self.store, self.prefix = store, f"{tenant}/"

    async def put(self, response: dict, items: list) -> None:
        await self.store.put({**response, "id": self.prefix + response["id"]}, items)

    async def conversation(self, response_id: str) -> list:
        try:
            return await self.store.conversation(self.prefix + response_id)
        except APIError as err:
            raise _previous_not_found(response_id) if err.status == 404 else err from None

    async def response(self, response_id: str) -> dict:
        try:
            return {**await self.store.response(self.prefix + response_id), "id": response_id}
        except APIError as err:
            raise _not_found(response_id) if err.status == 404 else err from None

    async def delete(self, response_id: str) -> None:
        try:
            await self.store.delete(self.prefix + response_id)
        except APIError as err:
            raise _not_found(response_id) if err.status == 404 else err from None


def responses_of(request: web.Request) -> ResponseStore | TenantResponses:
    """The stored responses the request's caller may use: its tenant's (every one, for the operator)."""
    store = request.app[RESPONSE_STORE]
    tenant = tenant_of(request)
    return store if tenant is None else TenantResponses(store, tenant)


def _previous_not_found(response_id: str) -> APIError:
    return APIError(404, f"Previous response with id '{response_id}' not found.",
                    param="previous_response_id", code="previous_response_not_found")


def _not_found(response_id: str) -> APIError:
    # Responses stream with store=false, and anything older than the last `max_responses`, are not kept.
    return APIError(404, f"Response with id '{response_id}' not found. This server keeps the last responses "
                    f"created with store=true: {DEFAULT_MAX_RESPONSES} of them, "
                    f"{DEFAULT_MAX_BYTES >> 20} MiB in all.", param="response_id", code="response_not_found")


def _unavailable(where: str, exc: Exception) -> APIError:
    reason = str(exc).strip() or "no reason given"
    return APIError(503, f"The response store at {where} does not answer: {reason}", type="server_error",
                    code="response_store_unavailable")


RESPONSE_STORE: web.AppKey[ResponseStore] = web.AppKey("response_store", ResponseStore)
