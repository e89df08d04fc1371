"""The OpenAI API's routes: models, Chat Completions, Responses (its stored responses, compaction)."""

from __future__ import annotations

from aiohttp import web

from . import compaction
from .chat import chat_completions
from .compact import compact_response
from .models import models
from .responses import create_response, delete_response, get_response


def add_routes(app: web.Application) -> None:
    compaction.setup(app)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/responses", create_response)
    app.router.add_post("/v1/responses/compact", compact_response)
    app.router.add_get("/v1/responses/{response_id}", get_response)
    app.router.add_delete("/v1/responses/{response_id}", delete_response)
