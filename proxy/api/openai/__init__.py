"""The OpenAI API: Chat Completions and Responses, each API's request, answer and stream in modules of
their own."""

from .routes import add_routes

__all__ = ["add_routes"]
