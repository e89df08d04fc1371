"""The Responses API's WebSocket mode (GET /v1/responses), driven by the openai SDK's own WebSocket
client (`client.responses.connect()`, openai 3.57): a multi-turn conversation that sends only what
each turn adds, lanes, refusals as `error` events, steering refused, and each turn traced and
counted as a request of its own."""

from __future__ import annotations

import json
import socket
import threading
import time

import openai
import pytest
from openai.types.responses.responses_server_event import ResponsesServerEvent
from pydantic import TypeAdapter

from looptrace.common import attributes as attr

from waiting import wait_until

MODEL = "tiny-qwen"
SERVER_EVENT = TypeAdapter(ResponsesServerEvent)
FIRST = "\n</think>\n\nThe code word is papaya.<|im_end|>"
SECOND = "\n</think>\n\nYou asked me to remember papaya.<|im_end|>"


def client(app, **headers) -> openai.OpenAI:
    return openai.OpenAI(base_url=app.url + "/v1", api_key="none", default_headers=headers, max_retries=0)


def turn(connection, **body) -> list[dict]:
    """One response.create and every event until its end, each checked against the SDK's server events."""
    connection.response.create(model=MODEL, **body)
    events = []
    while True:
        event = json.loads(connection.recv_bytes())
        SERVER_EVENT.validate_python(event, strict=True)
        events.append(event)
        if event["type"] in ("response.completed", "response.failed", "response.incomplete", "error"):
            return events


def test_a_multi_turn_conversation_over_the_sdks_websocket(replay_app):
    replay_app.replay(FIRST, SECOND)
    with client(replay_app, session_id="ws-conversation").responses.connect() as connection:
        first = turn(connection, input="Remember the code word papaya.", store=False)
        assert [e["sequence_number"] for e in first] == list(range(len(first)))
        done = first[-1]
        assert done["type"] == "response.completed", first[-1]
        assert "".join(e["delta"] for e in first if e["type"] == "response.output_text.delta") == \
            "The code word is papaya."
        # Only what the turn adds, with the response before named: kept by the socket though store=False.
        second = turn(connection, previous_response_id=done["response"]["id"], store=False,
                      input=[{"role": "user", "content": "What was the code word?"}])
        assert second[-1]["type"] == "response.completed", second[-1]
        assert second[-1]["response"]["previous_response_id"] == done["response"]["id"]
    steps = replay_app.stored("/v1/sessions/ws-conversation", steps=2)["steps"]
    assert len(steps) == 2
    trace = replay_app.stored(f"/v1/traces/{steps[1]['trace_id']}")
    root = next(s for s in trace["spans"] if attr.ENDPOINT in s["attributes"])["attributes"]
    assert root[attr.ENDPOINT] == attr.ENDPOINT_RESPONSES_WEBSOCKET and root[attr.TRANSPORT] == "websocket"
    prompt = replay_app.stored(f"/v1/traces/{steps[1]['trace_id']}/prompt")
    text = "".join(token[1] for token in prompt["tokens"])
    # The model read the whole conversation: the first turn's question and answer, then the new one.
    assert text.index("Remember the code word papaya.") < text.index("The code word is papaya.") \
        < text.index("What was the code word?")
    render = next(s for s in trace["spans"] if s["name"] == attr.SPAN_RENDER)["attributes"]
    # Tokenized from where it departs from the first turn's prompt (the long-session machinery).
    assert render[attr.PROMPT_REUSED_TOKENS] > 0, render
    assert replay_app.metric("looptrace_requests_total", endpoint=attr.ENDPOINT_RESPONSES_WEBSOCKET,
                             status="200") >= 2


def test_a_websocket_turn_parses_its_message_once(replay_app, responses_parses):
    # The envelope (type, stream_id) is read apart; the request itself once per turn, a warm-up too.
    replay_app.replay(FIRST, SECOND)
    with client(replay_app).responses.connect() as connection:
        warm = turn(connection, input="Remember papaya.", store=False, generate=False)
        assert responses_parses == ["ResponseCreate"], responses_parses
        done = turn(connection, input="Which word?", previous_response_id=warm[-1]["response"]["id"], store=False,
                    stream_id="lane-1")
        assert done[-1]["type"] == "response.completed", done[-1]
    assert responses_parses == ["ResponseCreate", "ResponseCreate"], responses_parses


def test_lanes_run_side_by_side_each_in_order(replay_app):
    replay_app.replay(*[FIRST] * 4)
    ended: dict[str, list[str]] = {"a": [], "b": []}
    created: dict[str, list[str]] = {"a": [], "b": []}
    with client(replay_app).responses.connect() as connection:
        for _ in range(2):  # both lanes' responses at once, then each lane's next after its end
            for lane in ("a", "b"):
                connection.response.create(model=MODEL, input=f"lane {lane}", stream_id=lane, store=False)
            done = 0
            while done < 2:
                event = json.loads(connection.recv_bytes())
                SERVER_EVENT.validate_python(event, strict=True)
                assert event["stream_id"] in ("a", "b") and event["type"] != "error", event
                if event["type"] == "response.created":
                    created[event["stream_id"]].append(event["response"]["id"])
                if event["type"] == "response.completed":
                    ended[event["stream_id"]].append(event["response"]["id"])
                    done += 1
    assert ended == created and all(len(ids) == 2 for ids in ended.values())  # each lane: created, ended, in order


def test_a_second_create_on_a_busy_lane_is_refused_and_the_running_response_goes_on(replay_app):
    """OpenAI's protocol: one response at a time on a lane. The second `response.create` is answered with an
    `error` event on that lane (409 `response_already_in_flight`, as the other typed refusals are shaped);
    the running response streams to its end untouched, another lane runs meanwhile, and once the first has
    ended its lane takes the next."""
    long = "\n</think>\n\n" + "word " * 60 + "<|im_end|>"
    slow = Slow(replay_app.replay(long, FIRST, FIRST, FIRST))
    replay_app.runtime.backend = slow
    with raw_socket(replay_app) as ws:
        def create(lane: str | None, text: str) -> None:
            ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": text, "store": False,
                                **({"stream_id": lane} if lane is not None else {})}))

        def read_through(kind: str, lane: str | None) -> list[dict]:
            seen = []
            while True:
                event = json.loads(ws.recv(timeout=30))
                SERVER_EVENT.validate_python(event, strict=True)
                seen.append(event)
                if event["type"] == kind and event.get("stream_id") == lane:
                    return seen

        create("a", "the long one")
        running = read_through("response.output_text.delta", "a")
        create("a", "too soon")  # lane a is still answering
        create("b", "another lane")  # lane b is free
        after = read_through("response.completed", "a")
        events = running + after
        errors = [e for e in events if e["type"] == "error"]
        assert len(errors) == 1, errors
        (error,) = errors
        assert error["stream_id"] == "a" and error["status"] == 409, error
        assert error["error"] == {"type": "invalid_request_error", "code": "response_already_in_flight",
                                  "param": "stream_id", "message": error["error"]["message"]}, error
        # The running response: one response, every word of it, in order, never interrupted.
        on_a = [e for e in events if e.get("stream_id") == "a" and e["type"] != "error"]
        assert {e["response"]["id"] for e in on_a if "response" in e} == {on_a[0]["response"]["id"]}
        assert "".join(e["delta"] for e in on_a if e["type"] == "response.output_text.delta") == \
            "word " * 60
        assert [e["sequence_number"] for e in on_a] == list(range(len(on_a)))
        # Lane b ran beside it (its answer complete, perhaps before a's end) and no error reached it.
        if not any(e["type"] == "response.completed" and e.get("stream_id") == "b" for e in events):
            events += read_through("response.completed", "b")
        assert not [e for e in events if e.get("stream_id") == "b" and e["type"] == "error"], events
        # The refused request was not run: the long answer, lane b's, and nothing else reached the backend.
        assert replay_app.runtime.backend.inner._next == 2
        # Lane a is free again; so is the default lane, which follows the same rule.
        create("a", "now")
        assert read_through("response.completed", "a")[-1]["response"]["status"] == "completed"
        create(None, "the default lane")
        create(None, "the default lane again")
        default = read_through("response.completed", None)
        (error,) = [e for e in default if e["type"] == "error"]
        assert (error["status"], error["error"]["code"], "stream_id" in error) == \
            (409, "response_already_in_flight", False), error


def test_a_create_sent_as_the_last_event_arrives_is_never_refused(replay_app):
    """The lane is free from its response's last event: a client that answers `response.completed` (or a
    warm-up's, or a refusal's `error`) with its next `response.create` at once finds it free."""
    replay_app.replay(*[FIRST] * 12)
    with raw_socket(replay_app) as ws:
        previous = None
        for n in range(12):
            body = {"type": "response.create", "model": MODEL, "input": f"turn {n}", "store": False,
                    "stream_id": "lane", "previous_response_id": previous}
            if n % 4 == 0:
                body["generate"] = False
            if n % 4 == 1:
                ws.send(json.dumps({**body, "model": "another-model"}))  # refused: its error is its end
                while (event := json.loads(ws.recv(timeout=30)))["type"] != "error":
                    pass
                assert event["error"]["code"] == "model_not_found", event
            ws.send(json.dumps(body))
            while (event := json.loads(ws.recv(timeout=30)))["type"] not in ("response.completed", "error"):
                pass
            assert event["type"] == "response.completed", event
            previous = event["response"]["id"]


def test_refusals_are_error_events_and_the_socket_goes_on(replay_app):
    replay_app.replay(FIRST)
    with client(replay_app).responses.connect() as connection:
        connection.send({"type": "response.create", "model": "another-model", "input": "x"})
        error = json.loads(connection.recv_bytes())
        SERVER_EVENT.validate_python(error, strict=True)
        assert error["type"] == "error" and error["status"] == 404 and error["error"]["code"] == "model_not_found"
        connection.send_raw('{"type": "response.create", "model": ')  # not JSON
        error = json.loads(connection.recv_bytes())
        assert error["status"] == 400 and error["error"]["code"] == "invalid_json", error
        connection.send_raw(json.dumps({"type": "session.update"}))
        error = json.loads(connection.recv_bytes())
        assert error["status"] == 400 and error["error"]["code"] == "unknown_event", error
        connection.send_raw(json.dumps({"type": "response.create", "model": MODEL, "input": "x", "background": True}))
        error = json.loads(connection.recv_bytes())
        assert error["status"] == 400 and error["error"]["param"] == "background", error
        connection.send_raw(json.dumps({"type": "response.create", "model": MODEL, "input": "x", "stream_id": "l" * 257}))
        error = json.loads(connection.recv_bytes())
        assert error["status"] == 400 and error["error"]["param"] == "stream_id", error
        connection.send({"type": "response.steer", "previous_response_id": "resp_1", "input": "faster"})
        steer = json.loads(connection.recv_bytes())
        SERVER_EVENT.validate_python(steer, strict=True)
        assert steer["type"] == "response.steer.failed" and steer["error"]["code"] == "steering_not_supported"
        assert turn(connection, input="still here?", store=False)[-1]["type"] == "response.completed"


def test_a_get_without_an_upgrade_says_what_the_route_is(replay_app):
    status, answer = replay_app.call("GET", "/v1/responses")
    assert status == 426 and answer["error"]["code"] == "upgrade_required", answer


def test_a_previous_response_unknown_to_the_socket_and_the_store(replay_app):
    with client(replay_app).responses.connect() as connection:
        (error,) = turn(connection, input="x", previous_response_id="resp_nowhere")
    assert error["status"] == 404 and error["error"]["code"] == "previous_response_not_found", error


def test_a_warm_up_generates_nothing_and_is_continued(replay_app):
    replay_app.replay(SECOND)
    with client(replay_app).responses.connect() as connection:
        warm = turn(connection, input="Remember papaya.", store=False, generate=False)
        assert [e["type"] for e in warm] == ["response.created", "response.in_progress", "response.completed"]
        assert warm[-1]["response"]["output"] == []
        after = turn(connection, input="Which word?", previous_response_id=warm[-1]["response"]["id"], store=False)
    assert after[-1]["type"] == "response.completed", after[-1]


@pytest.fixture
def keyed(replay_app):
    from looptrace.proxy.api.keys import SETTINGS

    settings = replay_app.app[SETTINGS]
    before = settings.api_key
    settings.api_key = "s3cret"
    yield replay_app
    settings.api_key = before


def test_the_key_is_asked_as_on_http(keyed):
    with pytest.raises(Exception) as refused:
        with client(keyed).responses.connect() as connection:
            connection.response.create(model=MODEL, input="x")
            connection.recv()
    assert "401" in str(refused.value)
    keyed.replay(FIRST)
    with openai.OpenAI(base_url=keyed.url + "/v1", api_key="s3cret").responses.connect() as connection:
        assert turn(connection, input="x", store=False)[-1]["type"] == "response.completed"


class Slow:
    """The replay backend, a token every 50 ms; says when its generation was closed, and after how many."""

    def __init__(self, inner) -> None:
        self.inner, self.name, self.route, self.running, self.waiting = inner, "replay", None, 0, 0
        self.serving, self.upstreams, self.expands_media, self.media_refusal = True, (), False, ""
        self.closed, self.tokens = threading.Event(), 0

    def health_details(self) -> dict:
        return {}

    async def generate(self, request):
        import asyncio

        try:
            async for event in self.inner.generate(request):
                if event["type"] == "token":
                    self.tokens += 1
                    await asyncio.sleep(0.05)
                yield event
        finally:
            self.closed.set()

    async def close(self) -> None:
        return None


def test_a_socket_that_closes_stops_its_responses(replay_app):
    """Closing the socket mid-answer stops the generation: nothing keeps running for a client gone."""
    from looptrace.proxy.api.openai.responses.running import RUNNING

    long = "\n</think>\n\n" + "word " * 400 + "<|im_end|>"
    slow = Slow(replay_app.replay(long))
    replay_app.runtime.backend = slow
    manager = client(replay_app).responses.connect()
    connection = manager.__enter__()
    connection.response.create(model=MODEL, input="x", store=False)
    while json.loads(connection.recv_bytes())["type"] != "response.output_text.delta":
        pass
    manager.__exit__(None, None, None)
    assert slow.closed.wait(10), "the generation went on after its socket closed"
    assert slow.tokens < 400
    assert len(replay_app.app[RUNNING]) == 0


def websocket_and_stop_reading(app, session: str, tokens: int) -> socket.socket:
    """A WebSocket on GET /v1/responses (the handshake by hand, on a socket with a small receive buffer),
    a response.create for a long answer, its first events read, then nothing: the socket stays open."""
    import base64
    import os

    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.connect(("127.0.0.1", app.port))
    key = base64.b64encode(os.urandom(16)).decode()
    client.sendall(f"GET /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                   f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nsession_id: {session}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += client.recv(1)
    assert head.startswith(b"HTTP/1.1 101"), head
    payload = json.dumps({"type": "response.create", "model": MODEL, "max_output_tokens": tokens, "store": False,
                          "input": "Write for ever."}).encode()
    mask = os.urandom(4)
    length = (bytes([0x80 | 126]) + len(payload).to_bytes(2, "big") if len(payload) < 65536 else
              bytes([0x80 | 127]) + len(payload).to_bytes(8, "big"))
    client.sendall(bytes([0x81]) + length + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))
    seen = b""
    while b"response.output_text.delta" not in seen:
        chunk = client.recv(1024)
        assert chunk, seen
        seen += chunk
    return client  # and never read again



def test_a_websocket_client_that_stops_reading_is_dropped_and_its_generation_stopped(replay_app, monkeypatch):
    """As a stream's (test_unread_stream.py): a socket whose client takes nothing of a write for
    --stream-write-timeout is aborted, its response's generation stopped, the request traced (499,
    client_stopped_reading) and counted. The replay backend writes as fast as it can, so the socket's
    buffers (the kernel's, megabytes on loopback) fill in seconds."""
    long = 150_000
    replay = replay_app.replay("\n</think>\n\n" + "word " * long + "<|im_end|>")
    monkeypatch.setattr(replay_app.runtime.settings, "stream_write_timeout", 2.0)
    unread = websocket_and_stop_reading(replay_app, "unread-socket", long + 10)
    try:
        wait_until(lambda: replay.running == 0, 120, what="the generation stopped for a client that read nothing")
        unread.settimeout(30)
        while unread.recv(65536):  # its connection was aborted: what is left to read ends
            pass
    finally:
        unread.close()
    steps = replay_app.stored("/v1/sessions/unread-socket")["steps"]
    trace = replay_app.stored(f"/v1/traces/{steps[0]['trace_id']}")
    root = next(s for s in trace["spans"] if attr.ENDPOINT in s["attributes"])["attributes"]
    assert (root[attr.HTTP_RESPONSE_STATUS_CODE], root[attr.ERROR_TYPE]) == (499, "client_stopped_reading"), root
    assert root[attr.TRANSPORT] == "websocket"
    decode = next(s for s in trace["spans"] if s["name"] == attr.SPAN_DECODE)
    assert 0 < len(decode.get("tokens", [])) < long  # its generation stopped before the end
    assert replay_app.metric("looptrace_requests_total", endpoint=attr.ENDPOINT_RESPONSES_WEBSOCKET,
                             status="499") >= 1
    replay_app.replay(FIRST)
    with client(replay_app).responses.connect() as connection:  # and the server goes on
        assert turn(connection, input="x", store=False)[-1]["type"] == "response.completed"


def raw_socket(app):
    """A WebSocket client that reads every message as it comes (websockets' own, not the SDK's)."""
    from websockets.sync.client import connect

    return connect(app.url.replace("http", "ws") + "/v1/responses", max_size=None)


def test_a_message_past_the_limit_closes_the_socket(replay_app, monkeypatch):
    from websockets.exceptions import ConnectionClosed

    from looptrace.proxy.api.openai.responses import websocket

    monkeypatch.setattr(websocket, "MAX_MESSAGE_BYTES", 4096)  # read when a socket opens
    with raw_socket(replay_app) as ws:
        ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "x" * 8192}))
        try:
            ws.recv(timeout=10)
        except ConnectionClosed as closed:
            assert closed.rcvd.code == 1009, closed  # "message too big"
        else:
            raise AssertionError("the socket took a message past its limit")


def test_lanes_past_the_limit_are_refused(replay_app, monkeypatch):
    from looptrace.proxy.api.openai.responses import websocket

    monkeypatch.setattr(websocket, "MAX_LANES", 2)
    slow = Slow(replay_app.replay(*["\n</think>\n\n" + "word " * 100 + "<|im_end|>"] * 2))
    replay_app.runtime.backend = slow
    with raw_socket(replay_app) as ws:
        for lane in ("a", "b", "c"):
            ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "x", "stream_id": lane,
                                "store": False}))
        while (event := json.loads(ws.recv(timeout=30)))["type"] != "error":
            pass
    assert (event["status"], event["error"]["code"], event["stream_id"]) == (429, "too_many_lanes", "c"), event


def test_an_idle_socket_is_closed(replay_app, monkeypatch):
    from websockets.exceptions import ConnectionClosed

    from looptrace.proxy.api.openai.responses import websocket

    monkeypatch.setattr(websocket, "IDLE_SECONDS", 0.5)
    with raw_socket(replay_app) as ws:
        started = time.monotonic()
        try:
            ws.recv(timeout=10)
        except ConnectionClosed as closed:
            assert closed.rcvd.code == 1000 and closed.rcvd.reason == "idle", closed
        assert time.monotonic() - started < 5
