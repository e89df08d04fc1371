"""The OpenAI API's routes: models, Chat Completions, Responses (over HTTP and in its WebSocket mode,
its stored responses, their input items, cancel, input tokens, compaction)."""

from __future__ import annotations

from aiohttp import web

from . import compaction
from .chat import chat_completions
from .compact import compact_response
from .models import models
from .response_actions import cancel_response, input_items, input_tokens
from .responses import create_response, delete_response, get_response
from .running import RUNNING, Running
from .websocket import responses_socket


def add_routes(app: web.Application) -> None:
    app[RUNNING] = Running()
    compaction.setup(app)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/responses", create_response)
    app.router.add_get("/v1/responses", responses_socket)
    app.router.add_post("/v1/responses/input_tokens", input_tokens)
    app.router.add_post("/v1/responses/compact", compact_response)
    app.router.add_get("/v1/responses/{response_id}", get_response)
    app.router.add_delete("/v1/responses/{response_id}", delete_response)
    app.router.add_get("/v1/responses/{response_id}/input_items", input_items)
    app.router.add_post("/v1/responses/{response_id}/cancel", cancel_response)
