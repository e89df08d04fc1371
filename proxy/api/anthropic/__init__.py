"""Anthropic's Messages API (Claude Code): its request and content blocks, answer, stream, errors."""

from .routes import ROUTES, setup

__all__ = ["ROUTES", "setup"]
