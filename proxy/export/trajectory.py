"""A rollout's steps stitched into trajectories, token-exact: what agent-RL trainers take, one row per
rollout rather than per request.

A step whose prompt starts with the step before's prompt and the ids its model sampled continues it
(the prompt's ids after those are the environment's: tool results, user turns, the template's turn
markup, masked 0); the model's sampled ids follow, masked 1 with their logprobs. A step that does not
continue its predecessor token for token (the template rewrote the history: REALIGN; the harness
edited it: FORK) starts a new trajectory, as tinker-cookbook's `trajectory_to_data` and AWS's rollout
gateway do: a trainer must never learn from ids the model did not sample. With token continuity
`keep` (proxy/engine/continuity.py) a rollout is one trajectory.

Each agent of a session (its subagents, its side requests: proxy/api/agents.py) is its own line: a
step continues the last trajectory of its own agent, so a subagent's turns between two of the main
agent's neither end the main line nor join it, and each trajectory says whose it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from looptrace.common import attributes as attr
from looptrace.trace_store.agent_tree import MAIN
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
    agent: str = MAIN  # whose line it is: the subagent's id, or the main agent's

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
    lines: dict[str, Trajectory] = {}  # each agent's last trajectory
    for step in steps:
        if step.skipped:
            continue
        agent = agent_of(step)
        last = lines.get(agent)
        held = last.held if last is not None else None
        if held is not None and step.prompt_ids[:len(held)] == held:
            last.add(step, step.prompt_ids[len(held):])
        else:
            trajectory = lines[agent] = Trajectory(list(step.prompt_ids), agent=agent)
            trajectory.add(step, [])
            found.append(trajectory)
    return found


def agent_of(step: Recorded) -> str:
    """The agent whose line a step is on: a subagent's or side request's id, else the main agent."""
    return step.request.get(attr.AGENT_ID) or MAIN
