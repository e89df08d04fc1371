"""The OpenAI API: Chat Completions and Responses, each API's request, answer and stream in modules of
their own."""

from .routes import ROUTES, setup

__all__ = ["ROUTES", "setup"]
