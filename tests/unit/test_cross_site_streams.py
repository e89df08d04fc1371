"""WebSockets and the viewer's live feed, the reads a page on another site could hold open (issue 55;
api/cross_site.py, api/viewer/sessions.py), through the real application on both stores:

- every WebSocket upgrade (the Responses API's, at its own path and under a rollout's) and the live
  feed (GET /v1/live, server-sent events read with the viewer's cookie) are refused with a 403 in the
  API's error shape when their Origin is another origin's (or the browser says `Sec-Fetch-Site:
  cross-site` or `same-site`), whatever they carry; a client with no Origin (codex, the SDKs) and the viewer's own
  page still connect;
- an open live feed ends within a second of its login's logout or expiry, or of its key's revoking,
  with `event: ended` and the refusal, and a new one is refused.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import time

import pytest

from looptrace.proxy.api.keys import TELEMETRY
from looptrace.proxy.api.viewer.session_cookie import COOKIE, COOKIES
from looptrace.proxy.settings import Settings
from looptrace.trace_store.api_keys import SECRET_ENV, KeyStore, server_secret

import stores as store_kinds
from app_thread import AppThread

MODEL = "tiny-qwen"
OPERATOR = "operator-key"
ANSWER = "\n</think>\n\nserved.<|im_end|>"


def from_elsewhere(app) -> list[dict]:
    """What a browser sends with a request another origin's page starts."""
    return [{"Origin": "http://evil.example"}, {"Origin": "null"},
            {"Origin": f"http://localhost:{app.port}"},  # the same port under another name: another origin
            {"Origin": "http://127.0.0.1:1", "Sec-Fetch-Site": "same-site"},  # another port of the same host
            {"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"},
            {"Sec-Fetch-Site": "cross-site"},
            {"Sec-Fetch-Site": "same-site"}]  # a no-cors fetch from another port of the host: no Origin


def ids(headers: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in headers.items())


def handshake(app, path: str, headers: dict) -> tuple[int, dict, bytes]:
    """A WebSocket upgrade sent by hand: (status, headers, body); 101 once the server took it."""
    sent = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(), **headers}
    connection = http.client.HTTPConnection("127.0.0.1", app.port, timeout=30)
    try:
        connection.request("GET", path, headers=sent)
        response = connection.getresponse()
        body = b"" if response.status == 101 else response.read()
        return response.status, dict(response.headers), body
    finally:
        connection.close()


def respond_over_socket(app, path: str = "/v1/responses", **connect) -> dict:
    """One response over a real WebSocket client (as the openai SDKs and codex speak it): its last event."""
    from websockets.sync.client import connect as ws_connect

    app.replay(ANSWER)
    with ws_connect(app.url.replace("http", "ws") + path, open_timeout=30, **connect) as socket:
        socket.send(json.dumps({"type": "response.create", "model": MODEL, "input": "hi"}))
        while (event := json.loads(socket.recv(timeout=60)))["type"] not in ("response.completed", "error"):
            pass
    return event


class Feed:
    """GET /v1/live held open, read event by event (a block of lines ended by a blank line)."""

    def __init__(self, app, headers: dict) -> None:
        self.connection = http.client.HTTPConnection("127.0.0.1", app.port, timeout=30)
        self.connection.request("GET", "/v1/live", headers=headers)
        self.response = self.connection.getresponse()
        self.status = self.response.status

    def next(self, timeout: float) -> list[str] | None:
        """The next event's lines; None at the end of the stream. A TimeoutError past `timeout`."""
        self.connection.sock.settimeout(timeout)
        lines = []
        while True:
            line = self.response.readline()
            if not line:
                return lines or None
            line = line.decode().rstrip("\n")
            if not line and lines:
                return lines
            if line:
                lines.append(line)

    def until_end(self, within: float) -> tuple[float, list[list[str]]]:
        """Reads to the end of the stream: (how long it took, the events read)."""
        started, events = time.monotonic(), []
        try:
            while (event := self.next(max(0.05, within - (time.monotonic() - started)))) is not None:
                events.append(event)
        except TimeoutError:
            raise AssertionError(f"the feed was still open after {within:g} s: {events}") from None
        return time.monotonic() - started, events

    def close(self) -> None:
        self.connection.close()


def opened(app, headers: dict) -> Feed:
    feed = Feed(app, headers)
    assert feed.status == 200, (feed.status, feed.response.read())
    assert feed.next(10) == [": watching"]
    return feed


def ended_with(events: list[list[str]]) -> dict:
    """The refusal the last event carries: `event: ended` and an error in the API's shape."""
    assert events and events[-1][0] == "event: ended", events
    body = json.loads(events[-1][1].removeprefix("data: "))
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


def refused_as_cross_site(status: int, body: bytes) -> None:
    assert status == 403, (status, body)
    error = json.loads(body)["error"]
    assert error["code"] == "cross_site_request" and error["type"] == "invalid_request_error", error
    assert b"evil" not in body and b"localhost" not in body  # the client's header is not repeated


@pytest.fixture(scope="module", params=store_kinds.KINDS)
def server(request, qwen3_5_dir, tmp_path_factory):
    """The replay backend, --api-key for the operator, and keys in the store."""
    folder = tmp_path_factory.mktemp("streams")
    (folder / "none.jsonl").write_text('{"text": "unused"}\n')
    made = store_kinds.of_param(request, folder)
    setting = str(folder / "traces.sqlite3") if made.kind == "sqlite" else made.setting()
    with pytest.MonkeyPatch.context() as env:
        env.setenv(SECRET_ENV, "streams-test-secret")  # never this machine's own secret file
        app = AppThread(Settings(model=str(qwen3_5_dir), backend="replay", replay=str(folder / "none.jsonl"),
                                 served_model_name=MODEL, trace_db=setting, api_key=OPERATOR)).start()
        keys = KeyStore(app.app[TELEMETRY].state, server_secret())
        made_keys = {name: keys.create(name) for name in ("alice", "carol")}
        yield app, keys, made_keys
        app.stop()
    made.close()


@pytest.fixture(scope="module")
def open_server(qwen3_5_dir, tmp_path_factory):
    """No key at all: whoever reaches it runs the model, so a page elsewhere must not reach it."""
    folder = tmp_path_factory.mktemp("open-streams")
    (folder / "none.jsonl").write_text('{"text": "unused"}\n')
    app = AppThread(Settings(model=str(qwen3_5_dir), backend="replay", replay=str(folder / "none.jsonl"),
                             served_model_name=MODEL, trace_db=str(folder / "traces.sqlite3"))).start()
    yield app
    app.stop()


def login(app, key: str) -> str:
    connection = http.client.HTTPConnection("127.0.0.1", app.port, timeout=30)
    try:
        connection.request("POST", "/v1/login", body=json.dumps({"key": key}),
                           headers={"Content-Type": "application/json", "Origin": app.url,
                                    "Sec-Fetch-Site": "same-origin"})
        response = connection.getresponse()
        assert response.status == 200, response.read()
        cookie = response.headers["Set-Cookie"]
        return cookie.split(";")[0].split("=", 1)[1]
    finally:
        connection.close()


def logout(app, cookie: str) -> dict:
    connection = http.client.HTTPConnection("127.0.0.1", app.port, timeout=30)
    try:
        connection.request("POST", "/v1/logout", headers={"Cookie": f"{COOKIE}={cookie}", "Origin": app.url})
        response = connection.getresponse()
        assert response.status == 200
        return json.loads(response.read())
    finally:
        connection.close()


def page(app, cookie: str) -> dict:
    """What the viewer's own page sends with GET /v1/live: its cookie; a same-origin GET has no Origin."""
    return {"Cookie": f"{COOKIE}={cookie}", "Accept": "text/event-stream", "Sec-Fetch-Site": "same-origin"}


def chat(app, key: str | None, session: str) -> None:
    app.replay(ANSWER)
    status, _ = app.call("POST", "/v1/chat/completions",
                         {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "ping"}]},
                         headers={"session_id": session, **({"Authorization": f"Bearer {key}"} if key else {})})
    assert status == 200


# -- (a) another origin's page --------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/responses", "/r/rollout-1/v1/responses"])
def test_a_websocket_from_another_origin_is_refused_even_with_a_key(server, path):
    app, _, made = server
    for headers in from_elsewhere(app):
        for key in ({}, {"Authorization": f"Bearer {made['alice']}"}):  # a key does not let it through
            status, answer_headers, body = handshake(app, path, {**headers, **key})
            refused_as_cross_site(status, body)
            assert answer_headers.get("Content-Type", "").startswith("application/json"), ids(headers)


def test_a_server_without_keys_serves_no_websocket_to_another_origins_page(open_server):
    # The hijacking a cross-site page would do: open the socket, run the model, read its answer.
    app = open_server
    for headers in from_elsewhere(app):
        refused_as_cross_site(*handshake(app, "/v1/responses", headers)[::2])
    from websockets.exceptions import InvalidStatus

    with pytest.raises(InvalidStatus) as refused:
        respond_over_socket(app, origin="http://evil.example")
    refused_as_cross_site(refused.value.response.status_code, refused.value.response.body)


@pytest.mark.parametrize("origin", [None, "self"], ids=["no Origin (codex, SDKs)", "the server's own Origin"])
def test_a_websocket_with_no_origin_or_its_own_runs(open_server, server, origin):
    for app, key in ((open_server, None), (server[0], server[2]["alice"])):
        connect = {"origin": app.url} if origin else {}
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        event = respond_over_socket(app, additional_headers=headers, **connect)
        assert event["type"] == "response.completed", event
        assert "served." in json.dumps(event["response"]["output"])
        assert handshake(app, "/r/rollout-1/v1/responses", {**headers, **({"Origin": app.url} if origin else {})}
                         )[0] == 101


def test_the_live_feed_from_another_origin_is_refused_with_the_cookie_or_a_key(server):
    app, _, made = server
    cookie = login(app, made["alice"])
    for headers in from_elsewhere(app):
        for credential in ({"Cookie": f"{COOKIE}={cookie}"}, {"Authorization": f"Bearer {made['alice']}"}, {}):
            feed = Feed(app, {"Accept": "text/event-stream", **headers, **credential})
            try:
                assert feed.status == 403, (ids(headers), feed.status)  # before reading: a feed never ends
                refused_as_cross_site(feed.status, feed.response.read())
            finally:
                feed.close()


def test_the_live_feed_from_the_viewers_own_page_or_an_agent_runs(server, open_server):
    app, _, made = server
    cookie = login(app, made["alice"])
    for headers in (page(app, cookie), {**page(app, cookie), "Origin": app.url},
                    {"Authorization": f"Bearer {made['alice']}"}):
        opened(app, headers).close()
    opened(open_server, {"Accept": "text/event-stream", "Origin": open_server.url}).close()
    opened(open_server, {}).close()


def test_other_gets_from_another_origin_are_as_before(server):
    # Only a socket or a held stream is refused so: a plain read's answer cannot be read by a page
    # elsewhere (no CORS is ever granted), and agents' GETs carry their key.
    app, _, made = server
    status, body = app.call("GET", "/v1/models", headers={"Authorization": f"Bearer {made['alice']}",
                                                          "Origin": "http://evil.example"})
    assert status == 200, body


# -- (b) the feed outlives no login ------------------------------------------------------------------


def test_an_open_feed_ends_within_a_second_of_its_logout_and_a_new_one_is_refused(server):
    app, _, made = server
    cookie = login(app, made["alice"])
    feed = opened(app, page(app, cookie))
    try:
        time.sleep(1.5)  # past several rechecks: a login that goes on keeps its feed
        chat(app, made["alice"], "feed-logout")
        step = feed.next(10)
        assert step and step[0].startswith("data: ") and json.loads(step[0][6:])["session"] == "alice/feed-logout", step
        assert logout(app, cookie) == {"object": "logout", "ended": True}
        took, events = feed.until_end(within=5)
    finally:
        feed.close()
    assert took < 1.5, took
    error = ended_with(events)
    assert error["code"] == "invalid_api_key" and "ended" in error["message"], error
    again = Feed(app, page(app, cookie))
    assert again.status == 401 and json.loads(again.response.read())["error"]["code"] == "invalid_api_key"
    again.close()


def test_an_open_feed_ends_when_its_login_expires(server):
    app, _, made = server
    token, expires_ns = app.app[COOKIES].sessions.open("alice", None, lifetime_s=2.0)
    feed = opened(app, page(app, token))
    try:
        took, events = feed.until_end(within=10)
    finally:
        feed.close()
    late = time.time_ns() - expires_ns
    assert 0 <= late < 1.5e9, late / 1e9  # ended after its expiry, within a second or so
    assert ended_with(events)["code"] == "invalid_api_key"
    again = Feed(app, page(app, token))
    assert again.status == 401
    again.close()


def test_an_open_feed_ends_when_its_key_is_revoked(server):
    app, keys, made = server
    feed = opened(app, {"Authorization": f"Bearer {made['carol']}"})
    try:
        assert keys.revoke("carol")
        revoked = time.monotonic()
        took, events = feed.until_end(within=5)
    finally:
        feed.close()
    assert time.monotonic() - revoked < 1.5, took
    error = ended_with(events)
    assert error["code"] == "invalid_api_key" and "revoked" in error["message"], error
    again = Feed(app, {"Authorization": f"Bearer {made['carol']}"})
    assert again.status == 401
    again.close()


def test_an_open_feed_on_a_server_without_keys_goes_on(open_server):
    app = open_server
    feed = opened(app, {})
    try:
        time.sleep(1.5)
        chat(app, None, "feed-open")
        step = feed.next(10)
        assert step and json.loads(step[0][6:])["session"] == "feed-open", step
        with pytest.raises(TimeoutError):
            feed.next(1.0)  # still open: nothing ended it
    finally:
        feed.close()


def test_an_open_responses_socket_refuses_its_next_response_once_its_key_is_revoked(server):
    """A key revoked while its WebSocket is open: the next response.create is refused with the key's 401, and
    the socket is closed; a new handshake with the key is refused as an HTTP request is."""
    from websockets.sync.client import connect as ws_connect

    app, keys, _ = server
    key = keys.create("erin")
    app.replay(ANSWER)
    headers = {"Authorization": f"Bearer {key}"}
    with ws_connect(app.url.replace("http", "ws") + "/v1/responses", open_timeout=30,
                    additional_headers=headers) as socket:
        socket.send(json.dumps({"type": "response.create", "model": MODEL, "input": "hi"}))
        while (event := json.loads(socket.recv(timeout=60)))["type"] not in ("response.completed", "error"):
            pass
        assert event["type"] == "response.completed", event
        assert keys.revoke("erin")
        time.sleep(1.0)  # past the guard's cache of a key's answer (auth.py)
        socket.send(json.dumps({"type": "response.create", "model": MODEL, "input": "again"}))
        refused = json.loads(socket.recv(timeout=30))
        assert refused["type"] == "error" and refused["status"] == 401, refused
        assert refused["error"]["code"] == "invalid_api_key", refused
        with pytest.raises(Exception):  # closed by the server (1008)
            socket.recv(timeout=10)
    assert handshake(app, "/v1/responses", headers)[0] == 401
