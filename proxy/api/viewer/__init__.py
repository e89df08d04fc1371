"""The trace viewer and the data it reads."""

from .routes import ROUTES, setup

__all__ = ["ROUTES", "setup"]
