"""The training–inference gap: POST /v1/rollouts/{rollout}/trainer-logprobs (the trainer's logprob of
each token the model wrote) and GET /v1/rollouts/{rollout}/gap (?cap=2): per token the log-ratio, per
step and rollout the k3 KL estimate, the share of tokens past the importance-ratio cap and the worst
tokens (trace_store/gap.py)."""

from __future__ import annotations

import math

from aiohttp import web
from pydantic import field_validator

from looptrace.common.jsonio import dumps
from looptrace.trace_store.gap import DEFAULT_CAP, rollout_gap

from ..errors import APIError, invalid
from ..query import Query, query_number
from ..stored import on_store, on_viewer_thread, store_of
from ..protocol import parse
from ..validation import json_body
from .protocol import TrainerLogprobs
from .store import rollout_key, rollout_steps, rollouts_of

MAX_VERSION_CHARS = 256


async def post_trainer_logprobs(request: web.Request) -> web.Response:
    """{"steps": [{"step": 1, "logprobs": [...]}, …]} (a step named by its place from 1, or by
    "trace_id"; one logprob per token it generated), or {"logprobs": [...]} for every generated token
    of the rollout in order; "weight_version": the trainer's label for its weights."""
    rollouts, key = rollouts_of(request), rollout_key(request)
    body = parse(TrainerLogprobs, await json_body(request))
    version = body.weight_version
    if version is not None and (len(version) > MAX_VERSION_CHARS or not version.isprintable()):
        raise invalid(f"'weight_version' is at most {MAX_VERSION_CHARS} printable characters.", param="weight_version")
    found = await rollout_steps(request, key)
    if found is None:
        raise APIError(404, f"No rollout {key!r} in the trace store (it may not be written yet, or was retired).",
                       param="rollout", code="rollout_not_found")
    steps = _per_step(body, found)
    await on_store(rollouts.set_trainer_logprobs, key, steps, version)
    return web.json_response(await _gap(request, key, DEFAULT_CAP), dumps=dumps)


def _per_step(body: TrainerLogprobs, steps: list[dict]) -> dict[str, list[float]]:
    """The logprobs by trace id, each step's as many as it generated tokens (`steps`: the store's)."""
    counts = {s["trace_id"]: s.get("output_tokens") or 0 for s in steps}
    order = [s["trace_id"] for s in steps]
    if body.logprobs is not None:
        values = _logprobs(body.logprobs, "logprobs")
        if len(values) != sum(counts.values()):
            raise invalid(f"'logprobs' holds {len(values)} values; the rollout's {len(order)} steps generated "
                          f"{sum(counts.values())} tokens.", param="logprobs")
        out, at = {}, 0
        for trace_id in order:
            if counts[trace_id]:
                out[trace_id], at = values[at:at + counts[trace_id]], at + counts[trace_id]
        return out
    if body.steps is None:
        raise invalid("Missing required parameter: 'steps'.", param="steps", code="missing_required_parameter")
    out = {}
    for n, item in enumerate(body.steps):
        param = f"steps[{n}]"
        step = item.named(param)
        by_place = item.step is not None  # a trace id may be all digits
        trace_id = order[int(step) - 1] if by_place and len(step) < 10 and int(step) <= len(order) else step
        if trace_id not in counts:
            raise invalid(f"'{param}' names no step of this rollout (it has {len(order)}).", param=param)
        values = _logprobs(item.logprobs, f"{param}.logprobs")
        if len(values) != counts[trace_id]:
            raise invalid(f"'{param}.logprobs' holds {len(values)} values; the step generated {counts[trace_id]} "
                          "tokens.", param=f"{param}.logprobs")
        out[trace_id] = values
    return out


def _logprobs(values: list[float], param: str) -> list[float]:
    """Numbers already (an integer of hundreds of digits is refused by the parse, which cannot make it one)."""
    if not all(math.isfinite(v) and v <= 0 for v in values):
        raise invalid(f"'{param}' must hold log-probabilities: finite numbers, none above 0.", param=param)
    return values


class GapQuery(Query):
    cap: float = DEFAULT_CAP

    @field_validator("cap", mode="before")
    @classmethod
    def _cap(cls, value: str) -> float:
        cap = query_number(value, "cap")
        if cap is None or not 1 < cap <= 1000:
            raise invalid("'cap' must be a number above 1 (an importance ratio's cap), at most 1000.", param="cap")
        return cap


async def get_gap(request: web.Request) -> web.Response:
    key = rollout_key(request)
    return web.json_response(await _gap(request, key, GapQuery.of(request).cap), dumps=dumps)


async def _gap(request: web.Request, key: str, cap: float) -> dict:
    rollouts, store = rollouts_of(request), store_of(request)
    trainer = await on_store(rollouts.trainer_logprobs, key)
    if not trainer:
        raise APIError(404, f"No trainer logprobs for rollout {key!r}: POST them to "
                       "/v1/rollouts/{rollout}/trainer-logprobs.", param="rollout", code="rollout_not_found")
    found = await on_viewer_thread(rollout_gap, store, key, trainer, cap)
    if found is None:
        raise APIError(404, f"No rollout {key!r} in the trace store.", param="rollout", code="rollout_not_found")
    return found
