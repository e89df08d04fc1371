"""Rollouts for agent RL: a base URL per rollout for harnesses that cannot add a header (routes.py; who
the rollout is: clients.py),
and a rollout's reward (rewards.py) and trainer logprobs with the training–inference gap (gap.py)."""

from .routes import ROUTES, setup

__all__ = ["ROUTES", "setup"]
