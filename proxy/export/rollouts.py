"""`looptrace export --format verl|skyrl|prime-rl|nemo-gym|tinker`: each session (a rollout) as rows
of a trainer's format (formats.py), one per rollout (its steps stitched: trajectory.py) or per step
(`--per step`), with its reward and the trainer's logprobs where they were posted (rollouts.py)."""

from __future__ import annotations

from statistics import fmean

from looptrace.common import attributes as attr
from looptrace.trace_store.location import open_state
from looptrace.trace_store.recorded_sessions import Recorded
from looptrace.trace_store.rollouts import Rollouts

from .formats import ROWS
from .trajectory import Trajectory, agent_of, stitched


def rollout_rows(sessions: list[tuple[str, list[Recorded]]], fmt: str, per: str, store: str) -> list[dict]:
    """`sessions`: (key, its steps) each. The rows in order; advantages against each group's mean."""
    kept = _rollouts(store)
    found = [(key, steps, _recorded(kept, key)) for key, steps in sessions]
    rows = []
    groups: dict[str | None, list[float]] = {}
    for _, _, (head, _, _) in found:
        if head.get("reward") is not None:
            groups.setdefault(head.get("group"), []).append(head["reward"])
    for key, steps, (head, step_rewards, trainer) in found:
        trajectories = stitched(steps) if per == "rollout" else [_alone(s) for s in steps if not s.skipped]
        for segment, trajectory in enumerate(trajectories):
            reward = head.get("reward")
            if reward is None:
                rewards = [r for r in (_step_reward(step_rewards, s) for s in trajectory.steps) if r is not None]
                reward = sum(rewards) if rewards else None
            group = groups.get(head.get("group")) if head.get("group") is not None else None
            advantage = reward - fmean(group) if reward is not None and group else reward
            meta = _meta(key, head, segment, trajectory, step_rewards, trainer)
            rows.append(ROWS[fmt](trajectory, reward, advantage, meta))
    return rows


def _step_reward(step_rewards: dict[str, float], step: Recorded) -> float | None:
    """A step's reward, posted by its trace id or by its place in the rollout."""
    return step_rewards.get(step.trace_id, step_rewards.get(str(step.step)))


def _alone(step: Recorded) -> Trajectory:
    trajectory = Trajectory(list(step.prompt_ids), agent=agent_of(step))
    trajectory.add(step, [])
    return trajectory


def _rollouts(store: str) -> Rollouts | None:
    try:
        state = open_state(store)
    except ValueError:
        return None
    return Rollouts(state) if state is not None else None


def _recorded(rollouts: Rollouts | None, key: str) -> tuple[dict, dict[str, float], dict]:
    """The rollout's row, its steps' rewards by trace id (steps named by their place are placed later)
    and the trainer's logprobs by trace id; empty where none were posted or the store has no table."""
    if rollouts is None:
        return {}, {}, {}
    try:
        head = rollouts.get(key) or {}
        trainer = rollouts.trainer_logprobs(key)
    except Exception:  # noqa: BLE001 - a store made before rollouts existed: none were posted
        return {}, {}, {}
    return head, {s.get("trace_id", str(s.get("step"))): s["reward"] for s in head.get("steps", [])}, trainer


def _meta(key: str, head: dict, segment: int, trajectory: Trajectory, step_rewards: dict, trainer: dict) -> dict:
    first = trajectory.steps[0]
    steps = []
    for step in trajectory.steps:
        reward = _step_reward(step_rewards, step)
        entry = {"step": step.step, "trace_id": step.trace_id,
                 "weight_version": step.request.get(attr.WEIGHT_VERSION),
                 "continuity": step.render.get(attr.PROMPT_CONTINUITY)}
        if reward is not None:
            entry["reward"] = reward
        if step.trace_id in trainer:
            entry["trainer_logprobs"], trained = trainer[step.trace_id]
            entry["trainer_weight_version"] = trained
        steps.append(entry)
    return {"rollout": key, "group": head.get("group"), "segment": segment, "agent": trajectory.agent,
            "reward": head.get("reward"),
            "info": head.get("info"), "model": first.model,
            "template_sha256": first.render.get(attr.TEMPLATE_SHA256),
            "tokenizer_sha256": first.render.get(attr.TOKENIZER_SHA256), "steps": steps}
