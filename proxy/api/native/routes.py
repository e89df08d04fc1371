"""looptrace's own routes that run token ids: fork, score, generate."""

from __future__ import annotations

from aiohttp import web

from .fork import fork_trace
from .generate import generate
from .score import score


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/traces/{trace_id}/fork", fork_trace)
    app.router.add_post("/v1/score", score)  # a replay's target: teacher-forced scoring
    app.router.add_post("/v1/generate", generate)  # and a prompt of token ids decoded afresh
