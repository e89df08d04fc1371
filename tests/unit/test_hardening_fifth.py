"""The fifth hardening pass (issue 53): every export line strict JSON whatever a client sent, errors said
in the user's words (never a Python exception's name), a WebSocket `stream_id` held to OpenAI's shape, a
shutdown that does not wait on a dead collector, and a replay out of answers said as a 503."""

from __future__ import annotations

import base64
import json
import logging
import re
import struct
import zlib

import pyarrow.parquet as pq
import pytest

from looptrace.proxy import cli
from looptrace.proxy.settings import Settings

from app_thread import AppThread

MODEL = "tiny"
HOSTILE_ARGUMENTS = '{"a": 1e400, "b": NaN, "c": 123456789012345678901234567890, "d": -Infinity}'
CALL = {"name": "f", "description": "A tool.", "parameters": {"type": "object", "properties": {}}}
EXPORTS = ["jsonl", "verl", "skyrl", "nemo-gym", "tinker", "atif"]


def strict(line: str) -> object:
    """A line as JSON.parse and orjson read it: NaN, Infinity and numbers past a float's range refused."""
    def refused(name):
        raise AssertionError(f"{name} in an export line: {line[:200]}")

    def finite(digits):
        value = float(digits)
        assert value not in (float("inf"), float("-inf")), f"{digits} overflows in an export line"
        return value

    return json.loads(line, parse_constant=refused, parse_float=finite)


@pytest.fixture(scope="module")
def app(qwen3_5_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("fifth")
    (folder / "none.jsonl").write_text('{"text": "unused"}\n')
    running = AppThread(Settings(model=str(qwen3_5_dir), backend="replay", replay=str(folder / "none.jsonl"),
                                 served_model_name=MODEL, trace_db=str(folder / "traces.sqlite3"))).start()
    yield running
    running.stop()


def export_file(app: AppThread, key: str, fmt: str, tmp_path) -> str:
    """`looptrace export` as a user runs it, into a file."""
    out = tmp_path / f"{key}.{fmt}"
    with pytest.raises(SystemExit) as done:
        cli.main(["export", "--store", app.runtime.settings.trace_db, "--session", key, "--format", fmt,
                  "--out", str(out)])
    assert done.value.code == 0
    return str(out)


def export(app: AppThread, key: str, fmt: str, tmp_path) -> list[str]:
    with open(export_file(app, key, fmt, tmp_path), encoding="utf-8") as lines:
        return lines.read().splitlines()


def test_a_hostile_history_leaves_every_export_line_strict_json(app, tmp_path):
    """M1: arguments holding 1e400, NaN and a 30-digit integer were answered, then written by `export
    --format atif` as `Infinity` and `NaN`, which strict parsers refuse: one request poisoned the file."""
    key = "hostile-arguments"
    history = [{"role": "user", "content": "Call f."},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": HOSTILE_ARGUMENTS}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "done"}]
    app.replay("Thinking.\n</think>\n\n<tool_call>\n<function=f>\n</function>\n</tool_call><|im_end|>")
    status, answer = app.call("POST", "/v1/chat/completions", {
        "model": MODEL, "messages": history, "tools": [{"type": "function", "function": CALL}], "logprobs": True},
        {"session_id": key})
    assert status == 200, answer
    app.stored(f"/v1/sessions/{key}", steps=1)
    for fmt in EXPORTS:
        lines = export(app, key, fmt, tmp_path)
        assert lines, fmt
        for line in lines:
            strict(line)
    for fmt in ("parquet", "prime-rl"):  # Parquet: the JSON held in its text columns
        table = pq.read_table(export_file(app, key, fmt, tmp_path)).to_pylist()
        assert table, fmt
        for row in table:
            if "looptrace" in row:
                strict(row["looptrace"])
            for call in row.get("tool_calls") or ():
                strict(call["arguments"])
    (trajectory,) = [strict(line) for line in export(app, key, "atif", tmp_path)]
    calls = [c for step in trajectory["steps"] for c in step.get("tool_calls", ())]
    kept = [c for c in calls if c["tool_call_id"] == "call_1"]
    assert kept and kept[0]["extra"]["arguments_text"] == HOSTILE_ARGUMENTS, kept  # kept as the client wrote it


# ---------------------------------------------------------------------------------------------
# L1: errors in the user's words
# ---------------------------------------------------------------------------------------------

PYTHON_NAMES = re.compile(r"\b\w*(Error|Exception|Warning)\b|Traceback|NoneType|object has no attribute")


def bomb_pdf(expanded: int = 80_000_000) -> bytes:
    """A PDF whose page tree sits in an object stream that inflates to `expanded` bytes: the page walk
    itself must decompress it (a cross-reference stream points into it)."""
    header = b"2 0 "
    body = b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>"
    packed = zlib.compress(header + body + b" " * (expanded - len(header) - len(body)), 9)
    objects = {1: b"<< /Type /Catalog /Pages 2 0 R >>",
               3: b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 300 144] >>",
               4: b"<< /Type /ObjStm /N 1 /First %d /Filter /FlateDecode /Length %d >>\nstream\n" % (len(header), len(packed))
               + packed + b"\nendstream"}
    out, offsets = bytearray(b"%PDF-1.5\n"), {}
    for number, text in objects.items():
        offsets[number] = len(out)
        out += b"%d 0 obj\n" % number + text + b"\nendobj\n"
    xref_at = len(out)
    rows = [struct.pack(">BIH", 0, 0, 65535), struct.pack(">BIH", 1, offsets[1], 0), struct.pack(">BIH", 2, 4, 0),
            struct.pack(">BIH", 1, offsets[3], 0), struct.pack(">BIH", 1, offsets[4], 0),
            struct.pack(">BIH", 1, xref_at, 0)]
    data = b"".join(rows)
    out += (b"5 0 obj\n<< /Type /XRef /Size 6 /W [1 4 2] /Root 1 0 R /Length %d >>\nstream\n" % len(data) + data
            + b"\nendstream\nendobj\nstartxref\n%d\n%%%%EOF\n" % xref_at)
    return bytes(out)


def asking_pdf(pdf: bytes) -> dict:
    return {"model": MODEL, "input": [{"role": "user", "content": [
        {"type": "input_text", "text": "What does it say?"},
        {"type": "input_file", "filename": "x.pdf", "file_data": "data:application/pdf;base64," + base64.b64encode(pdf).decode()}]}]}


@pytest.mark.parametrize(("pdf", "said", "code"), [
    (lambda: b"%PDF-1.4\n1 0 obj << /Type /Catalog /Pages 9 0 R >> garbage", "the PDF is damaged", "invalid_file"),
    (bomb_pdf, "expands past the limit of 75 MB", "file_too_large"),
], ids=["malformed", "decompression_bomb"])
def test_an_unreadable_pdf_is_said_in_the_users_words(app, pdf, said, code, caplog):
    """L1: these were "the PDF could not be read (AttributeError: 'NoneType' object has no attribute
    'get_object')" and "(LimitReachedError: Limit reached while decompressing. …)"."""
    with caplog.at_level(logging.INFO, logger="looptrace"):
        status, answer = app.call("POST", "/v1/responses", asking_pdf(pdf()))
    assert status == 400 and answer["error"]["code"] == code, answer
    assert said in answer["error"]["message"] and not PYTHON_NAMES.search(answer["error"]["message"]), answer
    assert any("could not be read" in r.getMessage() for r in caplog.records)  # pypdf's words are logged


# ---------------------------------------------------------------------------------------------
# L2: a WebSocket stream_id is what OpenAI's protocol allows
# ---------------------------------------------------------------------------------------------


def socket_events(app: AppThread, *creates: dict) -> list[dict]:
    """Each response.create sent on one socket, and every event until each has ended (an error included)."""
    from websockets.sync.client import connect

    events, ended = [], 0
    with connect(app.url.replace("http", "ws") + "/v1/responses", max_size=None) as ws:
        for create in creates:
            ws.send(json.dumps({"type": "response.create", "model": MODEL, "store": False, **create}))
        while ended < len(creates):
            event = json.loads(ws.recv(timeout=30))
            events.append(event)
            ended += event["type"] in ("response.completed", "response.failed", "response.incomplete", "error")
    return events


@pytest.mark.parametrize("lane", ["\u0000\n<script>", "", "a b", "lane/1", "é", "l" * 257])
def test_a_stream_id_outside_the_protocols_shape_is_refused_and_not_echoed(app, lane):
    """L2: `"\\u0000\\n<script>"` was served and echoed on every event of its responses."""
    (error,) = socket_events(app, {"input": "x", "stream_id": lane})
    assert error["type"] == "error" and error["status"] == 400, error
    assert (error["error"]["code"], error["error"]["param"]) == ("invalid_stream_id", "stream_id"), error
    assert "stream_id" not in error, error  # nothing of the refused id comes back


def test_a_stream_id_the_protocol_allows_is_served_and_echoed(app):
    lanes = ["a.b-c_1", "L" * 256]
    app.replay(*["\n</think>\n\nOk.<|im_end|>"] * len(lanes))
    events = socket_events(app, *({"input": "x", "stream_id": lane} for lane in lanes))
    done = {e["stream_id"] for e in events if e["type"] == "response.completed"}
    assert done == set(lanes), events[-1]
    assert all(e.get("stream_id") in lanes for e in events), events


# ---------------------------------------------------------------------------------------------
# L4: a replay out of answers is a 503, and /health says so
# ---------------------------------------------------------------------------------------------


def test_a_spent_replay_is_a_503_and_health_says_so(app):
    """L4: each request past the recording was a 500, the server failing, where it is out of answers."""
    app.replay("Only one.<|im_end|>")
    ask = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}
    assert app.call("GET", "/health")[1]["replay"] == {"steps": 1, "served": 0, "spent": False}
    assert app.call("POST", "/v1/chat/completions", ask)[0] == 200
    status, error = app.call("POST", "/v1/chat/completions", ask)
    assert (status, error["error"]["code"], error["error"]["type"]) == (503, "replay_exhausted", "server_error"), error
    assert "the replay is spent: all 1 recorded steps were served" in error["error"]["message"], error
    status, health = app.call("GET", "/health")  # up (a probe must not restart it), and out of answers
    assert (status, health["status"], health["replay"]["spent"]) == (200, "ready", True), health
    assert health["reason"] == "the replay is spent: every recorded step was served", health
    app.replay("Again.<|im_end|>")
    assert "reason" not in app.call("GET", "/health")[1]


def test_a_bug_in_a_handler_answers_with_a_reference_the_log_keeps(caplog):
    """L1: the middleware's 500 said `internal error: KeyError: 'x'`; now a reference, the traceback logged
    under it with the path as repr (a client's decoded %0a cannot forge a line)."""
    import asyncio

    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    from looptrace.proxy.api.errors import error_middleware

    async def broken(request):
        raise KeyError("secret internals")

    async def main():
        app = web.Application(middlewares=[error_middleware])
        app.router.add_get(r"/broken/{rest:[\s\S]*}", broken)
        async with TestClient(TestServer(app)) as client:
            response = await client.get("/broken/a%0aFORGED")
            return response.status, await response.json()

    status, body = asyncio.run(main())
    message = body["error"]["message"]
    assert (status, body["error"]["code"]) == (500, "internal_error") and "secret internals" not in message, body
    ref = re.search(r"error ([0-9a-f]{8})", message).group(1)
    (logged,) = [r for r in caplog.records if ref in r.getMessage()]
    assert "\n" not in logged.getMessage() and "secret internals" in str(logged.exc_info[1])
