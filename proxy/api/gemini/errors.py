"""Errors in Google's shape, `{"error": {"code", "message", "status"}}`: this API's routes register it
(routes.py), so that every error under them, the middleware's too, leaves in it; the google-genai SDK
raises its ClientError or ServerError from it."""

from __future__ import annotations

from ..errors import APIError

# google.rpc.Code's names for the HTTP statuses Google's APIs answer with.
_STATUSES = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
             405: "UNIMPLEMENTED",  # an action this server has not (embedContent, …): what Google says of one
             409: "ABORTED", 413: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED", 499: "CANCELLED",
             501: "UNIMPLEMENTED", 502: "UNAVAILABLE", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}


def google_status(status: int) -> str:
    return _STATUSES.get(status, "INTERNAL" if status >= 500 else "FAILED_PRECONDITION")


def google_body(error: APIError) -> dict:
    return {"error": {"code": error.status, "message": error.message, "status": google_status(error.status)}}
