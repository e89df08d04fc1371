"""Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, with the right status;
an API surface whose clients expect another shape registers it for its routes (`error_shape`:
anthropic/routes.py), and every error under them, the middleware's own included, leaves in it.

The engine and the backends refuse in their own terms (engine errors, BackendError); `api_error`
is the one place that turns those into HTTP answers.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from looptrace.backends.base import BackendError
from looptrace.common.jsonio import dumps

from ..engine.errors import Refused, Unavailable

log = logging.getLogger("looptrace")


class ClientStoppedReading(ConnectionResetError):
    """A stream's client took nothing of what was written to it for --stream-write-timeout seconds: it
    is treated as gone (its generation stops, its connection is closed), as one that disconnected is."""


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

    def response(self, shape: Callable[[APIError], dict] | None = None) -> web.Response:
        return web.json_response(shape(self) if shape else self.body(), status=self.status, dumps=dumps)


ErrorShape = Callable[[APIError], dict]
ERROR_SHAPES: web.AppKey[list] = web.AppKey("error_shapes", list)  # (path prefix, ErrorShape), as registered


def error_shape(app: web.Application, prefix: str, shape: ErrorShape) -> None:
    """Errors on `prefix` and the paths under it leave in `shape` (an API surface's own)."""
    app.setdefault(ERROR_SHAPES, []).append((prefix, shape))


def _shape_for(request: web.Request) -> ErrorShape | None:
    resource = request.match_info.route.resource
    # A route's own path (/r/{rollout}/v1/messages for any rollout), or the request's when none matched.
    path = resource.canonical if resource is not None else request.path
    for prefix, shape in request.app.get(ERROR_SHAPES, ()):
        if path == prefix or path.startswith(prefix + "/"):
            return shape
    return None


def internal_error(what: str) -> APIError:
    """A bug, answered in the API's shape without Python in it (a client cannot act on `KeyError: 'x'`):
    called in the `except` block, it logs the traceback under a short reference the answer gives."""
    ref = secrets.token_hex(4)
    log.exception("%s (error %s)", what, ref)
    return APIError(500, f"The server failed while answering (error {ref}); its log says why under that reference.",
                    type="server_error", code="internal_error")


def invalid(message: str, param: str | None = None, code: str | None = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def model_not_found(name: str, served: str | None) -> APIError:
    """`served` None: a key that may use no model this server serves is told none."""
    serves = f"this server serves `{served}`" if served is not None else "this key may use no model served here"
    return APIError(404, f"The model `{name}` does not exist; {serves}.", param="model", code="model_not_found")


def api_error(exc: Refused | Unavailable | BackendError) -> APIError:
    """What the client hears of an engine's or a backend's refusal."""
    if isinstance(exc, Refused):
        return APIError(400, exc.message, param=exc.param, code=exc.code)
    if isinstance(exc, Unavailable):
        return APIError(503, exc.message, type="server_error", code=exc.code)
    return APIError(exc.status, exc.message, type="server_error" if exc.status >= 500 else "invalid_request_error",
                    code=exc.code)


def answered(request: web.Request, exc: Refused | Unavailable | BackendError) -> APIError:
    """api_error, and for a backend that failed (a 5xx: an upstream unreachable, cut, or sending what
    cannot be read) one warning line: an operator must not find only a status code in the trace."""
    if isinstance(exc, BackendError) and exc.status >= 500:
        log.warning("%s %s: the backend failed with %d %s: %r", request.method, request.path, exc.status,
                    exc.code, exc.message)  # %r: an upstream's text must not forge log lines
    return api_error(exc)


def failure_of(exc: BaseException) -> tuple[int, str]:
    """The HTTP status a failure ends its request with, and its kind, for traces and metrics."""
    if isinstance(exc, (Refused, Unavailable, BackendError)):
        exc = api_error(exc)
    if isinstance(exc, APIError):
        return exc.status, exc.code or exc.type
    if isinstance(exc, web.HTTPException):
        return exc.status, type(exc).__name__
    if isinstance(exc, ClientStoppedReading):
        return 499, "client_stopped_reading"
    if isinstance(exc, (asyncio.CancelledError, ConnectionResetError)):
        return 499, "client_disconnected"  # nginx's code for a client that left
    return 500, type(exc).__name__


@web.middleware
async def error_middleware(request: web.Request, handler) -> web.StreamResponse:
    """Every failure leaves in its API's shape; nothing reaches the client as an HTML page or a bare 500."""
    try:
        return await handler(request)
    except APIError as err:
        return err.response(_shape_for(request))
    except (Refused, Unavailable, BackendError) as err:
        return answered(request, err).response(_shape_for(request))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        kind = "not_found" if exc.status == 404 else "method_not_allowed" if exc.status == 405 else None
        message = exc.text if exc.text and not exc.text.startswith(str(exc.status)) else f"{exc.reason}: {request.method} {request.path}"
        return APIError(exc.status, message, code=kind).response(_shape_for(request))
    except ConnectionResetError:
        # The client left mid-answer (traced as 499): nothing to log. This response is never sent;
        # aiohttp finds the connection gone and lets it be, where a raise would log a traceback.
        return web.Response(status=499)
    except Exception:  # noqa: BLE001 - a bug must still answer in the API's shape, and be logged
        # The path as repr: a client's %0a decoded into it must not forge a log line.
        return internal_error(f"unhandled error on {request.method} {request.path!r}").response(_shape_for(request))


class ProtocolErrorsInOneLine(logging.Filter):
    """For aiohttp's server logger: a request it could not parse (a header past HTTP_LIMITS, a broken
    request line) is the client's mistake, answered with a 400 before any handler runs (unreadable.py);
    it logs it as an error with a traceback. One warning line says all there is to say."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            record.msg, record.args = "refused a malformed HTTP request (%s): %s", (
                record.args[0] if record.args else "?", exc.message)
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True
