"""The Gemini API (Gemini CLI, the google-genai SDK): its contents and parts, answer, stream, errors."""

from .routes import ROUTES, setup

__all__ = ["ROUTES", "setup"]
