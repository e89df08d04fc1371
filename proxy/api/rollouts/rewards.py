"""A rollout's reward: POST /v1/rollouts/{rollout}/reward (a number for the rollout, or per step, with
free `info`), GET it back, and GET /v1/rollouts (?group=): the rollouts, newest first."""

from __future__ import annotations

from aiohttp import web

from looptrace.common.jsonio import dumps

from ..errors import APIError, invalid
from ..stored import on_store
from ..validation import field, json_body
from .store import info_of, rollout_key, rollouts_of, step_of

MAX_STEPS = 100_000


async def post_reward(request: web.Request) -> web.Response:
    """{"reward": 1.0, "info": {…}} for the rollout, and/or {"steps": [{"step": 3, "reward": 0.5,
    "info": {…}}, …]} (a step named by its place from 1, or by "trace_id"). Posting again replaces."""
    rollouts, key = rollouts_of(request), rollout_key(request)
    body = await json_body(request)
    reward = field(body, "reward", float, "reward")
    info = info_of(body.get("info"), "info")
    steps = []
    for n, item in enumerate(field(body, "steps", list, "steps") or []):
        param = f"steps[{n}]"
        if not isinstance(item, dict):
            raise invalid(f"Invalid type for '{param}': expected an object.", param=param, code="invalid_type")
        steps.append((step_of(item, param), field(item, "reward", float, f"{param}.reward", required=True),
                      info_of(item.get("info"), f"{param}.info")))
    if reward is None and not steps:
        raise invalid("Give the rollout's 'reward', or 'steps' each with its own.", param="reward",
                      code="missing_required_parameter")
    if len(steps) > MAX_STEPS:
        raise invalid(f"'steps' holds more than {MAX_STEPS} steps.", param="steps")
    await on_store(rollouts.set_reward, key, reward, info, steps)
    return web.json_response(await on_store(rollouts.get, key), dumps=dumps)


async def get_reward(request: web.Request) -> web.Response:
    rollouts, key = rollouts_of(request), rollout_key(request)
    found = await on_store(rollouts.get, key)
    if found is None:
        raise APIError(404, f"No rollout {key!r}: none of its requests or rewards reached this store.",
                       param="rollout", code="rollout_not_found")
    return web.json_response(found, dumps=dumps)


async def list_rollouts(request: web.Request) -> web.Response:
    """?group= (X-Rollout-Group as sent) &limit= (1 to 1000, 100 by default)."""
    rollouts = rollouts_of(request)
    limit = request.query.get("limit", "100")
    if not (limit.isascii() and limit.isdigit() and 1 <= int(limit) <= 1000):
        raise invalid("'limit' must be an integer from 1 to 1000.", param="limit")
    found = await on_store(rollouts.in_group, request.query.get("group"), int(limit))
    return web.json_response({"object": "list", "data": found}, dumps=dumps)
