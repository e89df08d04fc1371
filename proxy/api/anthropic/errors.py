"""Errors in Anthropic's shape, `{"type": "error", "error": {"type", "message"}}`: this API's routes
register it (routes.py), so that every error under them, the middleware's too, leaves in it."""

from __future__ import annotations

from ..errors import APIError

# The error types of Anthropic's API by status (its SDK's ErrorObject); a 413 is its invalid request.
_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error", 429: "rate_limit_error",
          504: "timeout_error", 529: "overloaded_error"}


def anthropic_type(status: int) -> str:
    return _TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def anthropic_body(error: APIError) -> dict:
    return {"type": "error", "error": {"type": anthropic_type(error.status), "message": error.message}}
