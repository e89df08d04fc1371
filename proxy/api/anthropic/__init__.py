"""Anthropic's Messages API (/v1/messages), which Claude Code speaks."""
