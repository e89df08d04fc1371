"""A rollout's steps stitched into trajectories, token-exact: what agent-RL trainers take, one row per
rollout rather than per request.

A step whose prompt starts with the step before's prompt and the ids its model sampled continues it
(the prompt's ids after those are the environment's: tool results, user turns, the template's turn
markup, masked 0); the model's sampled ids follow, masked 1 with their logprobs. A step that does not
continue its predecessor token for token (the template rewrote the history: REALIGN; the harness
edited it: FORK) starts a new trajectory, as tinker-cookbook's `trajectory_to_data` and AWS's rollout
gateway do: a trainer must never learn from ids the model did not sample. With token continuity
`keep` (proxy/engine/continuity.py) a rollout is one trajectory.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from looptrace.common import attributes as attr
from looptrace.trace_store.recorded_sessions import Recorded


@dataclass(slots=True)
class Trajectory:
    """One stitched run of steps: `prompt_ids` (the first step's prompt), then `response_ids` with a
    mask (1: the model sampled it) and the sampler's logprobs (0.0 where it did not)."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)
    steps: list[Recorded] = field(default_factory=list)

    @property
    def held(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def add(self, step: Recorded, environment: list[int]) -> None:
        sampled = [t["id"] for t in step.tokens]
        self.response_ids += environment + sampled
        # A redacted step's stored ids are not what the model read (common/redaction.py): masked, never trained on.
        sampled_mask = 0 if step.request.get(attr.REDACTED) else 1
        self.response_mask += [0] * len(environment) + [sampled_mask] * len(sampled)
        self.response_logprobs += [0.0] * len(environment) + [_logprob(t) for t in step.tokens]
        self.steps.append(step)


def _logprob(token: dict) -> float:
    value = token.get("logprob")
    return float(value) if value is not None else 0.0


def stitched(steps: list[Recorded]) -> list[Trajectory]:
    """The steps (those that can be read: `skipped` empty) as trajectories, in order."""
    found: list[Trajectory] = []
    for step in steps:
        if step.skipped:
            continue
        last = found[-1] if found else None
        held = last.held if last is not None else None
        if held is not None and step.prompt_ids[:len(held)] == held:
            last.add(step, step.prompt_ids[len(held):])
        else:
            trajectory = Trajectory(list(step.prompt_ids))
            trajectory.add(step, [])
            found.append(trajectory)
    return found
