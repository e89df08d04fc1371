"""The rollout routes: every API again under /r/{rollout}/ (so that `/r/{id}/v1` is a base URL for
OpenAI clients and `/r/{id}` one for Anthropic's), and /v1/rollouts/…."""

from __future__ import annotations

from aiohttp import web

from ..anthropic.errors import anthropic_body
from ..anthropic.messages import count_tokens, create_message
from ..clients import ROLLOUT_PREFIX as PREFIX
from ..errors import error_shape
from ..openai.chat import chat_completions
from ..openai.compact import compact_response
from ..openai.models import models
from ..openai.response_actions import cancel_response, input_items, input_tokens
from ..openai.responses import create_response, delete_response, get_response
from ..openai.websocket import responses_socket
from .gap import get_gap, post_trainer_logprobs
from .rewards import get_reward, list_rollouts, post_reward

API = (("GET", "/v1/models", models), ("POST", "/v1/chat/completions", chat_completions),
       ("POST", "/v1/responses", create_response), ("POST", "/v1/responses/compact", compact_response),
       ("GET", "/v1/responses/{response_id}", get_response),
       ("DELETE", "/v1/responses/{response_id}", delete_response), ("GET", "/v1/responses", responses_socket),
       ("POST", "/v1/responses/input_tokens", input_tokens), ("POST", "/v1/responses/{response_id}/cancel", cancel_response),
       ("GET", "/v1/responses/{response_id}/input_items", input_items), ("POST", "/v1/messages", create_message),
       ("POST", "/v1/messages/count_tokens", count_tokens))


def add_routes(app: web.Application) -> None:
    router = app.router
    for method, path, handler in API:
        router.add_route(method, PREFIX + path, handler)
    error_shape(app, PREFIX + "/v1/messages", anthropic_body)
    router.add_get("/v1/rollouts", list_rollouts)
    router.add_post("/v1/rollouts/{rollout}/reward", post_reward)
    router.add_get("/v1/rollouts/{rollout}/reward", get_reward)
    router.add_post("/v1/rollouts/{rollout}/trainer-logprobs", post_trainer_logprobs)
    router.add_get("/v1/rollouts/{rollout}/gap", get_gap)
