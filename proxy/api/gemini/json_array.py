"""`:streamGenerateContent` without `?alt=sse`: Google's other stream, one JSON array whose elements
(the same responses the SSE stream sends) arrive as they are made. A Framing (api/streaming.py) and
the sink it writes to: the response's headers go out with its first bytes."""

from __future__ import annotations

from aiohttp import web

from ..streaming import Event

HEADERS = {"Content-Type": "application/json; charset=UTF-8", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class JsonArray:
    messages = False

    def __init__(self, request: web.Request) -> None:
        self._request = request
        self._response: web.StreamResponse | None = None
        self._opened = False  # whether `[` was framed

    def frames(self, events: list[Event]) -> tuple[bytes, ...]:
        if not events:
            return ()
        out = []
        for _, data in events:
            out.append((b",\r\n" if self._opened else b"[") + data)
            self._opened = True
        return (b"".join(out),)

    def end(self, events: list[Event], done: bool) -> tuple[bytes, ...]:
        frames = self.frames(events)
        return (b"".join(frames) + (b"]" if self._opened else b"[]"),)

    def keepalive(self, events: list[Event]) -> tuple[bytes, ...]:
        return (b"\n",)  # whitespace, which JSON allows between any two tokens

    @property
    def response(self) -> web.StreamResponse:
        assert self._response is not None, "a stream's end is always written"
        return self._response

    async def write(self, burst: bytes) -> None:
        if self._response is None:
            self._response = web.StreamResponse(headers=HEADERS)
            await self._response.prepare(self._request)
        await self._response.write(burst)
