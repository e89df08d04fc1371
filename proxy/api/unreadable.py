"""Requests aiohttp cannot read (a request line or a header past app.HTTP_LIMITS, bytes that are not
HTTP) answered in the API's error shape, not in aiohttp's plain text.

aiohttp refuses them before any handler or middleware runs, from its connection handler's
`handle_error` (web_protocol.RequestHandler), and has no setting for that answer. So the application
makes its server with a connection handler of ours, which keeps what aiohttp does (its log line, the
connection closed after) and changes only the answer. This is the one place aiohttp's internals are
reached into: `Application._make_handler`, the server it returns, and that server's `_loop` and
`_kwargs`; tests/unit/test_hardening.py holds them to it.
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

from .errors import APIError


class _Connection(RequestHandler):
    __slots__ = ()

    def handle_error(self, request, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        answer = super().handle_error(request, status, exc, message)  # logs, and refuses once a byte is sent
        if not isinstance(exc, HttpProcessingError):
            return answer
        said = (exc.message or message or type(exc).__name__).replace("\n", " ")[:300]
        response = APIError(status, f"The request could not be read as HTTP: {said}",
                            code="invalid_http_request").response()
        response.force_close()
        return response


class _Server(web.Server):
    def __call__(self) -> RequestHandler:
        return _Connection(self, loop=self._loop, **self._kwargs)


def answer_unreadable_requests(app: web.Application) -> None:
    """Whatever runs `app` (web.run_app, an AppRunner) gets a server whose connections answer an
    unreadable request in the API's error shape."""
    make_handler = app._make_handler

    def make_server(*args, **kwargs) -> web.Server:
        server = make_handler(*args, **kwargs)
        server.__class__ = _Server  # the same object, its connections made by the class above
        return server

    app._make_handler = make_server
