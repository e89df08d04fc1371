"""Anthropic's Messages API (Claude Code): its routes, and its error shape for them."""

from __future__ import annotations

from aiohttp import web

from ..errors import error_shape
from .errors import anthropic_body
from .messages import count_tokens, create_message


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/messages", create_message)
    app.router.add_post("/v1/messages/count_tokens", count_tokens)
    error_shape(app, "/v1/messages", anthropic_body)
