"""Anthropic's Messages API (Claude Code): its request and content blocks, answer, stream, errors."""

from .routes import add_routes

__all__ = ["add_routes"]
