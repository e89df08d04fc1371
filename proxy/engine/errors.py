"""Why the engine will not, or cannot, run a request. The API maps each to its HTTP answer."""

from __future__ import annotations


class EngineError(Exception):
    def __init__(self, message: str, *, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param  # the request field at fault, where there is one


class Refused(EngineError):
    """The request cannot run as asked (the chat template refused it, it does not fit the context):
    the client's to fix."""


class Unavailable(EngineError):
    """The model cannot take requests now (still loading, failed to load, its server unreachable)."""
