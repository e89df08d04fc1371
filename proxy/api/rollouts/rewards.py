"""A rollout's reward: POST /v1/rollouts/{rollout}/reward (a number for the rollout, or per step, with
free `info`), GET it back, and GET /v1/rollouts (?group=): the rollouts, newest first.

A reward is for a rollout the trace store holds, and for its steps only (a step past its end, or a
trace of another session, is a 400): anyone who reaches the port may post, and a reward for a rollout
that never made a request would take one of the slots of those that did. `--allow-unknown-rollout-rewards`
lets an operator take them (a harness judged elsewhere), steps then named up to MAX_STEPS. A rollout's
infos together are bounded (trace_store/rollouts.py), and a post is answered in a few bytes: GET reads
the whole rollout back."""

from __future__ import annotations

from aiohttp import web

from looptrace.common.jsonio import dumps
from looptrace.trace_store.rollouts import MAX_ROLLOUT_INFO_BYTES, MAX_STEPS, info_json

from ..auth import sees
from ..errors import APIError, invalid
from ..keys import RUNTIME
from ..query import Query, between
from ..stored import on_store
from ..protocol import parse
from ..validation import json_body
from .protocol import RewardPost, StepReward, bounded_info
from .store import named, rollout_key, rollout_steps, rollouts_of

Step = tuple[str, float, dict | None]  # (the step as named, its reward, its info)


async def post_reward(request: web.Request) -> web.Response:
    """{"reward": 1.0, "info": {…}} for the rollout, and/or {"steps": [{"step": 3, "reward": 0.5,
    "info": {…}}, …]} (a step named by its place from 1, or by "trace_id"). Posting again replaces.
    Answers the rollout's reward, how many steps have one, and the bytes its infos hold."""
    rollouts, key = rollouts_of(request), rollout_key(request)
    body = parse(RewardPost, await json_body(request))
    reward, info = body.reward, bounded_info(body.info, "info")
    if info is not None and reward is None:  # `info` is the rollout's reward's: alone it would be dropped
        raise invalid("'info' goes with the rollout's 'reward'; a step's goes in its own entry of 'steps'.",
                      param="info")
    listed = body.steps or []
    if len(listed) > MAX_STEPS:
        raise invalid(f"'steps' names more than {MAX_STEPS:,} steps; a rollout holds at most that many steps' "
                      "rewards.", param="steps")
    held = await on_store(rollouts.held, key)
    order = await _trace_ids(request, key, noted=held is not None)
    steps = [_step(item, f"steps[{n}]", order) for n, item in enumerate(listed)]
    if reward is None and not steps:
        raise invalid("Give the rollout's 'reward', or 'steps' each with its own.", param="reward",
                      code="missing_required_parameter")
    held = held or (None, 0, {})
    answer = {"rollout": named(request, key), "reward": reward if reward is not None else held[0],
              **_bounded(reward, info, steps, held)}
    await on_store(rollouts.set_reward, key, reward, info, steps)
    return web.json_response(answer, dumps=dumps)


async def _trace_ids(request: web.Request, key: str, *, noted: bool) -> list[str] | None:
    """The rollout's steps' trace ids in order. None where the trace store does not hold it yet but its
    requests were noted (another worker's spans may not be written yet), or where the operator allows
    rewards for rollouts never seen; else a 404."""
    steps = await rollout_steps(request, key)
    if steps is not None:
        return [s["trace_id"] for s in steps]
    if noted or request.app[RUNTIME].settings.allow_unknown_rollout_rewards:
        return None
    raise APIError(404, f"No rollout {key!r} in the trace store: a reward is for a rollout that made requests here "
                   "(it may not be written yet, or was retired); --allow-unknown-rollout-rewards takes others.",
                   param="rollout", code="rollout_not_found")


def _step(item: StepReward, param: str, order: list[str] | None) -> Step:
    """One entry of 'steps', its step one the rollout has (any up to MAX_STEPS when `order` is None)."""
    step, by_place = item.named(param), item.step is not None  # a trace id may be all digits
    last = len(order) if order is not None else MAX_STEPS
    if by_place and (len(step) > 9 or int(step) > last):
        has = f"the rollout has {last} step{'' if last == 1 else 's'}" if order is not None else \
            f"at most step {MAX_STEPS:,} is taken"
        raise invalid(f"'{param}.step' is past the rollout's end: {has}.", param=f"{param}.step")
    if not by_place and order is not None and step not in order:
        raise invalid(f"'{param}.trace_id' is not one of the rollout's {len(order)} steps.", param=f"{param}.trace_id")
    return step, item.reward, bounded_info(item.info, f"{param}.info")


def _bounded(reward: float | None, info: dict | None, steps: list[Step], held: tuple) -> dict:
    """What the rollout will hold once this post replaced what it names: a 400 naming the entry that
    takes its infos past MAX_ROLLOUT_INFO_BYTES."""
    _, held_info, held_steps = held
    named = {step: (n, len(info_json(step_info or None) or "")) for n, (step, _, step_info) in enumerate(steps)}
    total = sum(size for step, size in held_steps.items() if step not in named)
    adding = [("info", len(info_json(info) or ""))] if reward is not None else []
    total += held_info if reward is None else 0
    adding += [(f"steps[{n}].info", size) for n, size in sorted(named.values())]
    for param, size in adding:
        total += size
        if total > MAX_ROLLOUT_INFO_BYTES:
            raise invalid(f"With '{param}' the rollout's infos would hold {total:,} bytes; a rollout's 'info' and its "
                          f"steps' hold at most {MAX_ROLLOUT_INFO_BYTES:,} bytes together.", param=param)
    count = len(held_steps.keys() | named.keys())
    if count > MAX_STEPS:  # a rollout the store does not hold, its steps named by trace ids post after post
        raise invalid(f"With 'steps' the rollout would hold {count:,} steps' rewards; a rollout holds at most "
                      f"{MAX_STEPS:,}.", param="steps")
    return {"step_rewards": count, "info_bytes": total}


async def get_reward(request: web.Request) -> web.Response:
    rollouts, key = rollouts_of(request), rollout_key(request)
    found = await on_store(rollouts.get, key)
    if found is None:
        raise APIError(404, f"No rollout {key!r}: none of its requests or rewards reached this store.",
                       param="rollout", code="rollout_not_found")
    return web.json_response({**found, "rollout": named(request, key)}, dumps=dumps)


class RolloutsQuery(Query):
    group: str | None = None
    limit: between(1, 1000) = 100


async def list_rollouts(request: web.Request) -> web.Response:
    """?group= (X-Rollout-Group as sent) &limit= (1 to 1000, 100 by default): the caller's tenant's
    rollouts alone, each named as its requests named it."""
    rollouts = rollouts_of(request)
    query = RolloutsQuery.of(request)
    found = await on_store(rollouts.in_group, query.group, query.limit, sees(request))
    return web.json_response({"object": "list", "data": [{**r, "rollout": named(request, r["rollout"])}
                                                         for r in found]}, dumps=dumps)
