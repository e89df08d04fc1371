"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with the right status."""

from __future__ import annotations

import logging

from aiohttp import web

from .json_text import dumps

log = logging.getLogger("looptrace")


class APIError(Exception):
    def __init__(
        self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> web.Response:
        return web.json_response(self.body(), status=self.status, dumps=dumps)


def invalid(message: str, param: str | None = None, code: str | None = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def model_not_found(name: str, served: str) -> APIError:
    return APIError(
        404, f"The model `{name}` does not exist; this server serves `{served}`.", param="model", code="model_not_found"
    )


def unavailable(message: str, code: str = "model_not_ready") -> APIError:
    return APIError(503, message, type="server_error", code=code)


@web.middleware
async def error_middleware(request: web.Request, handler) -> web.StreamResponse:
    """Every failure leaves in OpenAI's shape; nothing reaches the client as an HTML page or a bare 500."""
    try:
        return await handler(request)
    except APIError as err:
        return err.response()
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        kind = "not_found" if exc.status == 404 else "method_not_allowed" if exc.status == 405 else None
        message = exc.text if exc.text and not exc.text.startswith(str(exc.status)) else f"{exc.reason}: {request.method} {request.path}"
        return APIError(exc.status, message, code=kind).response()
    except Exception as exc:  # noqa: BLE001 - a bug must still answer in the API's shape, and be logged
        log.exception("unhandled error on %s %s", request.method, request.path)
        return APIError(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error", code="internal_error").response()
