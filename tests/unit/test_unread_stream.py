"""A stream whose client stops reading frees the model after --stream-write-timeout (issue 35,
finding 5). The local and llama.cpp backends decode one request at a time; nothing bounded how long a
client could hold that slot without reading, so a stream opened and never read held it for ever and
every later request waited behind it. Now a client that takes nothing for the bound is treated as
gone: its connection is closed, its generation stops, the next request runs; the request is traced
(499, error.type client_stopped_reading) and counted (looptrace_requests_total, status 499).

The client here is a real socket on loopback with a small receive buffer, which reads the stream's
headers and first frames and then nothing more, holding the connection open.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request

import pytest

from looptrace.common import attributes as attr
from looptrace.proxy.settings import Settings

from app_thread import AppThread

MODEL = "tiny-gemma"
BOUND = 2.0  # --stream-write-timeout for this app
LONG = 20_000  # tokens the unread stream asks for: far more than its buffers hold


@pytest.fixture(scope="module")
def app(gemma4_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("unread")
    # The tiny Gemma 4 (it decodes hundreds of tokens a second here, the tiny Qwen3.5 a few dozen), its
    # socket buffer fixed small (on loopback the kernel grows it to megabytes, minutes of tokens before
    # a write blocks): the bound is what is tested, not the kernel's buffers.
    served = AppThread(Settings(model=str(gemma4_dir), served_model_name=MODEL, max_queue=4,
                                stream_write_timeout=BOUND, trace_db=str(folder / "traces.sqlite3")),
                       send_buffer=16384).start()
    yield served
    served.stop()


def open_and_stop_reading(app, session: str) -> socket.socket:
    """A streamed chat request, its headers and first bytes read, then nothing: the socket stays open."""
    # Greedy: the tiny model never writes a stop token on this prompt (3,000 tokens checked), so the
    # answer runs to max_tokens, minutes of decoding here, unless the server stops it.
    body = json.dumps({"model": MODEL, "stream": True, "max_tokens": LONG, "temperature": 0,
                       "logprobs": True, "top_logprobs": 5,  # big frames: the buffers fill sooner
                       "chat_template_kwargs": {"enable_thinking": False},
                       "messages": [{"role": "user", "content": "Write for ever."}]}).encode()
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: the window it offers
    client.connect(("127.0.0.1", app.port))
    client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                   + f"session_id: {session}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    head = b""
    while b"data: " not in head:
        chunk = client.recv(1024)
        assert chunk, head
        head += chunk
    assert head.startswith(b"HTTP/1.1 200"), head[:200]
    return client  # and never read again


def chat(app, max_tokens: int = 2) -> tuple[int, dict]:
    return app.call("POST", "/v1/chat/completions", {
        "model": MODEL, "max_tokens": max_tokens, "chat_template_kwargs": {"enable_thinking": False},
        "messages": [{"role": "user", "content": "Hi"}]})


def test_a_client_that_stops_reading_frees_the_model_after_the_bound(app):
    unread = open_and_stop_reading(app, "unread-stream")
    try:
        began = time.monotonic()
        answered: list = []
        waiting = threading.Thread(target=lambda: answered.append(chat(app)), daemon=True)
        waiting.start()  # queued behind the unread stream: the model decodes one request at a time
        waiting.join(120)
        assert answered, "the next request was still waiting for the model after 120 s"
        assert answered[0][0] == 200, answered
        waited = time.monotonic() - began
        # The unread stream ran until its buffers filled, then BOUND seconds more, then was dropped.
        assert waited >= BOUND, waited
        # Its connection was closed: what is left to read ends, with far fewer tokens than it asked for.
        unread.settimeout(30)
        rest = b""
        while chunk := unread.recv(65536):
            rest += chunk
        assert b"data: [DONE]" not in rest
    finally:
        unread.close()
    steps = app.stored("/v1/sessions/unread-stream")["steps"]
    trace = app.stored(f"/v1/traces/{steps[0]['trace_id']}")
    root = next(s for s in trace["spans"] if attr.ENDPOINT in s["attributes"])
    assert root["attributes"][attr.HTTP_RESPONSE_STATUS_CODE] == 499, root["attributes"]
    assert root["attributes"][attr.ERROR_TYPE] == "client_stopped_reading"
    decode = next(s for s in trace["spans"] if s["name"] == attr.SPAN_DECODE)
    assert 0 < len(decode.get("tokens", [])) < LONG  # its generation stopped
    with urllib.request.urlopen(app.url + "/metrics", timeout=30) as response:
        metrics = response.read().decode()
    assert any(line.startswith("looptrace_requests_total{") and 'status="499"' in line and 'endpoint="chat"' in line
               and not line.endswith(" 0.0") for line in metrics.splitlines()), metrics[:3000]

