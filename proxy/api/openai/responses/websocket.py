"""GET /v1/responses: the Responses API's WebSocket mode (OpenAI's "WebSocket mode" guide; the Open
Responses specification's `x-openresponses-websocket`), what codex's built-in `openai` provider tries
first and the openai SDKs' `client.responses.connect()` speaks.

The client sends `response.create` messages: the POST body's fields (no `stream`: every response is
streamed), with an optional `stream_id`, a lane. A lane answers one response at a time; lanes run side
by side. A `response.create` on a lane whose response has not ended is refused, as OpenAI's protocol
refuses it (an `error` event on that lane, 409 `response_already_in_flight`): the running response goes
on untouched, and the client sends it again after that response's last event. The lane is free from
the moment its response's last event (`response.completed`, `.failed`, `.incomplete`, or the `error`
event of a refused request) is handed to the socket, so a client that answers that event at once is
never refused. The server sends each response's ordinary stream events, one message each, with the
lane's `stream_id`; a request refused before its stream is an `error` event with its HTTP-style
`status` (the specification's WebSocketErrorEvent), and the socket goes on.

A conversation on one socket sends only what it adds: `previous_response_id` names the response
before, which the socket keeps whether or not it was stored (`store: false` included, as OpenAI's
mode does), and each lane is a conversation of its own to the long-session machinery (unless the
client's headers name one), so a turn's prompt is tokenized from where it departs from the lane's
last one (docs/long-sessions.md). Every turn is a request of its own to the traces and metrics
(`looptrace.endpoint` `responses_websocket`, `looptrace.transport` `websocket`).

Limits, like the HTTP ones: a message of at most MAX_MESSAGE_BYTES (the HTTP body limit; past it the
socket is closed with 1009), MAX_LANES lanes answering at once (past them an `error` event, 429
`too_many_lanes`), a socket idle (nothing sent, nothing running) for IDLE_SECONDS
is closed; a client that stops reading is dropped after --stream-write-timeout as a stream's is, and
its generation stopped. `response.steer` is answered `response.steer.failed`
(`steering_not_supported`): steering needs a successor response the model can be switched to
mid-answer, which no backend here has.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections import OrderedDict
from collections.abc import Callable
from functools import partial

from aiohttp import WSCloseCode, WSMsgType, web

from looptrace.backends.base import BackendError
from looptrace.common import attributes as attr
from looptrace.common.jsonio import dumps

from ....engine.errors import Refused, Unavailable
from ...auth import GUARD
from ...cross_site import is_websocket_upgrade
from ...errors import APIError, ClientStoppedReading, answered, internal_error, invalid
from ...protocol import parse
from ...serving import traced
from ...streaming import Event
from ...validation import json_object
from .default_model import with_model
from .http import respond
from .protocol import LANE_ID, Envelope, ResponseCreate, Steer
from .request import Previous, converted
from .store import responses_of
from .stream import ResponseBuilder

log = logging.getLogger("looptrace")

MAX_MESSAGE_BYTES = 256 * 1024**2  # as an HTTP body (app.py's client_max_size)
MAX_LANES = 16
MAX_LANE_ID = 256  # characters of a stream_id (protocol.py's LANE_ID)
IDLE_SECONDS = 3600.0
KEPT_RESPONSES = 64  # the socket's own responses that previous_response_id may name (its lanes' latest, and more)


async def responses_socket(request: web.Request) -> web.WebSocketResponse:
    if not is_websocket_upgrade(request):
        raise APIError(426, "GET /v1/responses is the Responses API's WebSocket mode: connect with a WebSocket "
                       "upgrade (POST /v1/responses creates a response over HTTP).", code="upgrade_required")
    ws = web.WebSocketResponse(max_msg_size=MAX_MESSAGE_BYTES, compress=False)  # no deflate on the token path
    await ws.prepare(request)
    socket = Socket(request, ws)
    try:
        await socket.serve()
    finally:
        await socket.stop()
    return ws


class Socket:
    """One client's socket: its lanes, and the responses it may continue."""

    def __init__(self, request: web.Request, ws: web.WebSocketResponse) -> None:
        self.request, self.ws = request, ws
        self.id = "ws_" + secrets.token_hex(8)
        self.busy: dict[str | None, asyncio.Task] = {}  # lane → the task whose response has not yet ended
        self.tasks: set[asyncio.Task] = set()  # every lane's task, those finishing after their end included
        self.kept: OrderedDict[str, list] = OrderedDict()  # response id → its conversation, output included
        self.models: dict[str, str] = {}  # response id → its model, for a follow-up that names none
        self.sequence = 0  # for events outside any response (errors, steering)

    async def serve(self) -> None:
        while not self.ws.closed:
            try:
                message = await self.ws.receive(timeout=IDLE_SECONDS)
            except TimeoutError:
                if self.tasks:
                    continue  # a turn is running: not idle
                await self.ws.close(code=1000, message=b"idle")
                return
            if message.type == WSMsgType.TEXT:
                await self.received(message.data)
            elif message.type == WSMsgType.BINARY:
                await self.error(invalid("Binary messages are not read: send each event as JSON text.",
                                         code="invalid_json"), None)
            else:  # closing, closed, or an error (a message past MAX_MESSAGE_BYTES: aiohttp closed with 1009)
                return

    async def received(self, text: str) -> None:
        event: dict = {}
        lane: str | None = None
        try:
            event = json_object(text.encode(), text)
            envelope = parse(Envelope, event)
            if envelope.stream_id is not None and not LANE_ID.fullmatch(envelope.stream_id):
                # OpenAI's protocol: it is echoed on every event of the lane's responses, so it must be short and
                # plain (no control characters or markup to copy thousands of times into a client's log).
                raise invalid(f"'stream_id' must be 1 to {MAX_LANE_ID} characters of A-Z, a-z, 0-9, '_', '.' "
                              "and '-'.", param="stream_id", code="invalid_stream_id")
            lane = envelope.stream_id
            if envelope.type == "response.steer":
                await self.steer_refused(event)
                return
            if envelope.type != "response.create":
                raise invalid(f"Unknown event type {envelope.type!r}: this socket takes 'response.create' (and "
                              "'response.steer').", param="type", code="unknown_event")
            if (refused := await self.refused()) is not None:  # its key revoked, its login ended
                await self.error(refused, lane)
                await self.ws.close(code=WSCloseCode.POLICY_VIOLATION, message=b"credential refused")
                return
            self.start(event, lane)
        except APIError as err:
            await self.error(err, lane)

    async def refused(self) -> APIError | None:
        """Why the socket's caller may no longer ask (as a new request's would be: auth.py, cached for a
        moment), or None: a key revoked while its socket is open gets no further response."""
        try:
            await self.request.app[GUARD].caller(self.request)
        except APIError as refused:
            return refused
        return None

    def start(self, event: dict, lane_id: str | None) -> None:
        """The response on its lane, or refused: one at a time on a lane, as OpenAI's protocol says."""
        if lane_id in self.busy:
            lane = "the default lane (no stream_id)" if lane_id is None else f"lane {lane_id!r}"
            raise APIError(409, f"A response is already in flight on {lane}: send this response.create after "
                           "its last event, or on another stream_id.", param="stream_id",
                           code="response_already_in_flight")
        if len(self.busy) >= MAX_LANES:
            raise APIError(429, f"This socket has {MAX_LANES} lanes with responses running; at most that many "
                           "run at once.", param="stream_id", code="too_many_lanes")
        task = asyncio.create_task(self.run(event, lane_id))
        self.busy[lane_id] = task
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def ended(self, lane_id: str | None) -> bool:
        """The calling lane task's response has ended (its last events go out next): the lane takes the next.
        False when it had ended already."""
        if self.busy.get(lane_id) is asyncio.current_task():
            del self.busy[lane_id]
            return True
        return False

    async def run(self, event: dict, lane_id: str | None) -> None:
        try:
            await self.create(event, lane_id)
        except (ClientStoppedReading, ConnectionResetError) as exc:
            # Its connection is aborted (or gone): the socket's loop sees it closed and stops the other lanes.
            log.info("WebSocket %s dropped: %s", self.id, exc)
        finally:
            self.ended(lane_id)

    async def create(self, event: dict, lane_id: str | None) -> None:
        try:
            body = parse(ResponseCreate, event)  # the turn's one parse: the envelope's fields and the request's
            previous = Previous.of(await self.previous(body.previous_response_id))
            body = await with_model(self.request, body, self.models.get(body.previous_response_id or ""))
            if body.generate is False:
                await self.warm_up(event, body, previous, lane_id)  # no generation: nothing to trace
                return
            async with traced(self.request, attr.ENDPOINT_RESPONSES_WEBSOCKET, {attr.TRANSPORT: "websocket"},
                              continued=False) as trace:  # a trace per turn, not one for the socket's life
                await respond(self.request, trace, event, body, previous,
                              sink=Frames(self.ws, lane_id, partial(self.ended, lane_id)),
                              conversation=f"{self.id}/{lane_id or ''}", kept=self.keep)
        except (APIError, Refused, Unavailable, BackendError) as err:
            err = err if isinstance(err, APIError) else answered(self.request, err)
            if self.ended(lane_id):  # refused before its stream: the error event is its end
                await self.error(err, lane_id)
            else:  # after its last event (the trace's own end): the lane may be answering another by now
                log.warning("WebSocket %s: a response ended, then failed: %s", self.id, err.message)
        except (ClientStoppedReading, ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception:  # noqa: BLE001 - a bug must still answer, as an error event, and be logged
            err = internal_error(f"WebSocket {self.id}: response.create failed")
            if self.ended(lane_id):
                await self.error(err, lane_id)

    async def previous(self, previous_id: str | None) -> list | None:
        """The conversation `previous_response_id` continues: this socket's own first (stored or not)."""
        if previous_id is None:
            return None
        kept = self.kept.get(previous_id)
        if kept is not None:
            self.kept.move_to_end(previous_id)
            return kept
        return await responses_of(self.request).conversation(previous_id)

    def keep(self, response: dict, items: list) -> None:
        self.kept[response["id"]] = items + response["output"]
        self.models[response["id"]] = response["model"]
        while len(self.kept) > KEPT_RESPONSES:
            self.models.pop(self.kept.popitem(last=False)[0], None)

    async def warm_up(self, event: dict, body: ResponseCreate, previous: Previous | None,
                      lane_id: str | None) -> None:
        """`generate: false`: a response with no output, whose id later turns continue from."""
        _, options, names = converted(body, previous)
        builder = ResponseBuilder(options.model, names, options.echo, stream=True)
        events = builder.start() + builder.without_output()
        self.keep(builder.final, options.items)
        frames = Frames(self.ws, lane_id, partial(self.ended, lane_id))
        await frames.write(frames.end(events, True))

    async def steer_refused(self, event: dict) -> None:
        asked = Steer.model_validate(event)
        steer = {"input": asked.input, "previous_response_id": asked.previous_response_id}
        await self.send({"type": "response.steer.failed", "steer": steer, "error": {
            "type": "invalid_request_error", "code": "steering_not_supported",
            "message": "Steering is not supported by this server: send the input with the next response.create."}})

    async def error(self, err: APIError, lane_id: str | None) -> None:
        """A refusal as the specification's WebSocketErrorEvent (the openai SDK's ResponseWsError)."""
        event = {"type": "error", "status": err.status, "error": err.body()["error"]}
        if lane_id is not None:
            event["stream_id"] = lane_id
        await self.send(event)

    async def send(self, event: dict) -> None:
        event["sequence_number"] = self.sequence
        self.sequence += 1
        if not self.ws.closed:
            try:
                await self.ws.send_str(dumps(event))
            except ConnectionResetError:
                pass  # the client left: its lanes are stopped on the way out

    async def stop(self) -> None:
        """The socket closed: every lane's response stops (its generation with it)."""
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            try:
                await task
            except BaseException:  # noqa: BLE001 - each was traced as it ended; nothing to report here
                pass


class Frames:
    """A response's events as WebSocket messages (a Framing: api/streaming.py): each event's JSON is one
    text message, with the lane's `stream_id` as its first field. SSE's `event:` lines, comments and
    terminal `[DONE]` are not the socket's: nothing of them ever reaches it. `ended` is called as the
    response's last events are framed, before they are sent: its lane is free for the next response
    from then on."""

    __slots__ = ("ws", "tag", "ended")
    messages = True  # each frame is a message: the FrameWriter hands `write` a burst as a list

    def __init__(self, ws: web.WebSocketResponse, lane_id: str | None,
                 ended: Callable[[], object] | None = None) -> None:
        self.ws = ws
        self.tag = b'{"stream_id":' + dumps(lane_id).encode() + b"," if lane_id is not None else b""
        self.ended = ended

    def frames(self, events: list[Event]) -> list[bytes]:
        # Each event's JSON is an object the format made: the lane goes in after its opening brace.
        tag = self.tag
        return [tag + data[1:] for _, data in events] if tag else [data for _, data in events]

    def end(self, events: list[Event], done: bool) -> list[bytes]:
        if self.ended is not None:
            self.ended()
        return self.frames(events)

    def keepalive(self, events: list[Event]) -> list[bytes]:
        return self.frames(events)  # none of SSE's comments: a WebSocket's own pings keep it open

    async def write(self, messages: list[bytes]) -> None:
        for message in messages:
            await self.ws.send_frame(message, WSMsgType.TEXT)
