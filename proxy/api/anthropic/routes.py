"""Anthropic's Messages API (Claude Code): its routes, and its error shape for them."""

from __future__ import annotations

from aiohttp import web

from ..clients import ROLLOUT_PREFIX
from ..errors import error_shape
from ..route import Route, Scope
from .errors import anthropic_body
from .messages import count_tokens, create_message

ROUTES = (
    Route("POST", "/v1/messages", create_message, Scope.INFER, rollout=True),
    Route("POST", "/v1/messages/count_tokens", count_tokens, Scope.INFER, rollout=True),
)


def setup(app: web.Application) -> None:
    for prefix in ("", ROLLOUT_PREFIX):
        error_shape(app, prefix + "/v1/messages", anthropic_body)
