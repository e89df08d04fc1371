"""looptrace's own routes that run token ids: fork, score, generate."""

from __future__ import annotations

from aiohttp import web

from ..route import Route, Scope
from .fork import fork_trace
from .generate import generate
from .score import score

ROUTES = (
    Route("POST", "/v1/traces/{trace_id}/fork", fork_trace, Scope.INFER),
    Route("POST", "/v1/score", score, Scope.INFER),  # a replay's target: teacher-forced scoring
    Route("POST", "/v1/generate", generate, Scope.INFER),  # and a prompt of token ids decoded afresh
)


def setup(app: web.Application) -> None:
    """Nothing kept: a fork reads its trace from the store."""
