"""The rollout routes under /v1/rollouts/…: a rollout's reward, its trainer logprobs and the gap between
them. (Every API is also under /r/{rollout}/, for harnesses that cannot add a header: the APIs' routes
say `rollout=True`, and route.py mounts them there.)"""

from __future__ import annotations

from aiohttp import web

from ..route import Route, Scope
from .gap import get_gap, post_trainer_logprobs
from .rewards import get_reward, list_rollouts, post_reward

ROUTES = (
    Route("GET", "/v1/rollouts", list_rollouts, Scope.TRACES_READ),
    Route("POST", "/v1/rollouts/{rollout}/reward", post_reward, Scope.INFER),
    Route("GET", "/v1/rollouts/{rollout}/reward", get_reward, Scope.TRACES_READ),
    Route("POST", "/v1/rollouts/{rollout}/trainer-logprobs", post_trainer_logprobs, Scope.INFER),
    Route("GET", "/v1/rollouts/{rollout}/gap", get_gap, Scope.TRACES_READ),
)


def setup(app: web.Application) -> None:
    """Rollouts keep no state of their own here: rewards and logprobs go to the trace store."""
