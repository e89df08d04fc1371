"""The rollout routes' bodies, as models: a reward (POST /v1/rollouts/{rollout}/reward) and trainer
logprobs (POST /v1/rollouts/{rollout}/trainer-logprobs), each for the rollout or per step, a step
named by its place from 1 or by its trace.

What a type cannot say (a step named one way and only one, a trace id's shape, an info's size as
stored, log-probabilities none above 0) the routes check where they read the values, with the
place it is found at.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from looptrace.trace_store.rollouts import MAX_INFO_BYTES, info_json

from ..errors import invalid
from ..protocol import Protocol

Info = dict[str, Any]  # free, bounded as stored (bounded_info)


class StepNamed(Protocol):
    """A step as a request names it: its place in the rollout ("step": 3, from 1), or its trace ("trace_id")."""

    step: Annotated[int, Field(ge=1)] | None = None
    trace_id: str | None = None

    def named(self, param: str) -> str:
        """The step as given, "3" or the trace id."""
        if (self.step is None) == (self.trace_id is None):
            raise invalid(f"'{param}' names its step by 'step' (from 1) or 'trace_id', one of them.", param=param)
        if self.step is not None:
            return str(self.step)
        trace_id = self.trace_id
        if len(trace_id) != 32 or any(c not in "0123456789abcdef" for c in trace_id):
            raise invalid(f"'{param}.trace_id' must be a trace id: 32 lowercase hex digits.", param=f"{param}.trace_id")
        return trace_id


class StepReward(StepNamed):
    reward: float
    info: Info | None = None


class RewardPost(Protocol):
    """{"reward": 1.0, "info": {…}} for the rollout, and/or {"steps": [{"step": 3, "reward": 0.5, "info": {…}}, …]}."""

    reward: float | None = None
    info: Info | None = None
    steps: list[StepReward] | None = None


class StepLogprobs(StepNamed):
    logprobs: list[float]  # one per token the step generated


class TrainerLogprobs(Protocol):
    """{"steps": [{"step": 1, "logprobs": [...]}, …]}, or {"logprobs": [...]} for every generated token of
    the rollout in order; "weight_version": the trainer's label for its weights."""

    weight_version: str | None = None
    logprobs: list[float] | None = None
    steps: list[StepLogprobs] | None = None


def bounded_info(info: Info | None, param: str) -> Info | None:
    if info is not None and len(info_json(info)) > MAX_INFO_BYTES:  # as stored
        raise invalid(f"'{param}' is larger than {MAX_INFO_BYTES} bytes as JSON.", param=param)
    return info
