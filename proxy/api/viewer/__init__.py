"""The trace viewer and the data it reads."""

from .routes import add_routes

__all__ = ["add_routes"]
