"""The OpenAI API's routes: models, Chat Completions, Responses (over HTTP and in its WebSocket mode,
its stored responses, their input items, cancel, input tokens, compaction)."""

from __future__ import annotations

from aiohttp import web

from ..keys import TELEMETRY
from ..route import Route, Scope
from .chat.completions import chat_completions
from .models import models
from .responses.cancel import cancel_response
from .responses.compaction import plan as compaction
from .responses.compaction.run import compact_response
from .responses.http import create_response, delete_response, get_response
from .responses.input_items import input_items
from .responses.input_tokens import input_tokens
from .responses.running import RUNNING, Running
from .responses.store import RESPONSE_STORE, ResponseStore, SharedResponseStore
from .responses.websocket import responses_socket

INFER = Scope.INFER
ROUTES = (
    Route("GET", "/v1/models", models, INFER, rollout=True),
    Route("POST", "/v1/chat/completions", chat_completions, INFER, rollout=True),
    Route("POST", "/v1/responses", create_response, INFER, rollout=True),
    Route("GET", "/v1/responses", responses_socket, INFER, rollout=True),  # the WebSocket mode
    Route("POST", "/v1/responses/input_tokens", input_tokens, INFER, rollout=True),
    Route("POST", "/v1/responses/compact", compact_response, INFER, rollout=True),
    Route("GET", "/v1/responses/{response_id}", get_response, INFER, rollout=True),
    Route("DELETE", "/v1/responses/{response_id}", delete_response, INFER, rollout=True),
    Route("GET", "/v1/responses/{response_id}/input_items", input_items, INFER, rollout=True),
    Route("POST", "/v1/responses/{response_id}/cancel", cancel_response, INFER, rollout=True),
)


def setup(app: web.Application) -> None:
    # With a trace store, stored responses live in it: any process serves any turn.
    state = app[TELEMETRY].state
    store = app[RESPONSE_STORE] = SharedResponseStore(state) if state is not None else ResponseStore()
    app[RUNNING] = Running()
    compaction.setup(app)

    async def close(app: web.Application) -> None:
        store.close()

    app.on_cleanup.append(close)
