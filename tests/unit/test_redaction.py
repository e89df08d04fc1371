"""Secrets never stored (issue 55): the detector finds each kind of credential and leaves code, SHAs and
UUIDs alone; its markers match for one secret and keep a prompt's length; and a server with the SQLite
store or the PostgreSQL one, sent a corpus of credentials in messages, tool arguments and tool results
over Chat Completions, Responses (HTTP and WebSocket, a stored response continued), Messages and the
Gemini API, answers every request, hands the model the real text (the continued turn too: the state
store keeps it sealed), and keeps none of them, nor their base64, in what its store holds (SQLite: every
byte of its files, traces and state, their -wal and -shm; PostgreSQL: every row of every table of its
schema, read raw, and the schema's `pg_dump`), its OTLP export, its log or any `looptrace export` format.

Every secret is assembled from parts here at test time, with random bodies: nothing in this file is a
live-looking key that a push-protection scanner would flag.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import gzip
import io
import json
import logging
import random
import string
import sqlite3
import subprocess
import threading
import zlib
from array import array
from unittest import mock
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from looptrace.common.redaction import Redactor
from looptrace.backends.recorded import ReplayBackend
from looptrace.proxy.api.keys import TELEMETRY
from looptrace.proxy.export.arguments import export_arguments
from looptrace.proxy.export import command as export_command
from looptrace.proxy.export.command import run as run_export
from looptrace.proxy.settings import Settings
from looptrace.trace_store.recorded_sessions import open_reader

import stores as store_kinds
from app_thread import AppThread, Reading

ALNUM = string.ascii_letters + string.digits
HEX = "0123456789abcdef"
MODEL = "tiny"


def corpus(seed: int = 55) -> dict[str, tuple[str, str]]:
    """kind → (text holding the secret, the secret itself), each body random."""
    rnd = random.Random(seed)

    def r(n: int, alphabet: str = ALNUM) -> str:
        return "".join(rnd.choice(alphabet) for _ in range(n))
    pem_body = "\n".join(r(64, ALNUM + "+/") for _ in range(4))
    pem = "-----BEGIN " + "RSA PRIVATE KEY-----\n" + pem_body + "\n-----END RSA " + "PRIVATE KEY-----"
    aws_secret, pw, dbpass, apikey, url_pw = r(40, ALNUM + "/+"), r(14), r(12), r(32), r(12)
    azure, sas, key_id = r(86, ALNUM + "+/") + "==", r(43, ALNUM + "%"), r(40, HEX)
    gcp_pem = "-----BEGIN " + "PRIVATE KEY-----\n" + pem_body + "\n-----END " + "PRIVATE KEY-----\n"
    ec_body, ssh_body, db_pw = r(64, ALNUM + "+/"), r(70, ALNUM + "+/"), r(16)
    shapes = {
        "aws_access_key_id": ("AK" + "IA" + r(16, string.ascii_uppercase + string.digits),) * 2,
        "aws_secret_access_key": ("aws_secret_access_key = " + aws_secret, aws_secret),
        "github_token": ("gh" + "p_" + r(36),) * 2,
        "github_pat": ("github" + "_pat_" + r(22) + "_" + r(59),) * 2,
        "gitlab_token": ("gl" + "pat-" + r(20),) * 2,
        "openai_api_key": ("sk-" + "proj-" + r(48),) * 2,
        "anthropic_api_key": ("sk-" + "ant-api03-" + r(93) + "AA",) * 2,
        "google_api_key": ("AI" + "za" + r(35),) * 2,
        "huggingface_token": ("hf" + "_" + r(34),) * 2,
        "groq_api_key": ("gs" + "k_" + r(52),) * 2,
        "stripe_key": ("sk" + "_live_" + r(24),) * 2,
        "slack_token": ("xo" + "xb-" + r(12, string.digits) + "-" + r(24),) * 2,
        "slack_webhook": ("https://hooks.slack.com/" + "services/T" + r(8) + "/B" + r(8) + "/" + r(24),) * 2,
        "twilio_api_key": ("S" + "K" + r(32, HEX),) * 2,
        "sendgrid_api_key": ("S" + "G." + r(22) + "." + r(43),) * 2,
        "npm_token": ("np" + "m_" + r(36),) * 2,
        "pypi_token": ("py" + "pi-AgEIcHlwaS5vcmc" + r(60),) * 2,
        "private_key": (pem, pem),
        "ec_private_key": ("-----BEGIN EC " + "PRIVATE KEY-----\n" + ec_body + "\n-----END EC " + "PRIVATE KEY-----",
                           ec_body),
        "openssh_private_key": ("-----BEGIN OPENSSH " + "PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA" + ssh_body +
                                "\n-----END OPENSSH " + "PRIVATE KEY-----", ssh_body),
        "database_url": ("DATABASE_" + "URL=mysql://app:" + db_pw + "@db.internal/app", db_pw),
        "gcp_service_account": (json.dumps({"type": "service_account", "private_key_id": key_id,
                                            "private_key": gcp_pem}), key_id),
        "gcp_service_account_key": (json.dumps({"type": "service_account", "private_key": gcp_pem}),
                                    pem_body.splitlines()[1]),
        "jwt": ("ey" + "JhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0." + r(43),) * 2,
        "azure_storage_key": ("DefaultEndpointsProtocol=https;AccountName=acct;Account" + "Key=" + azure, azure),
        "azure_sas_signature": ("https://acct.blob.core.windows.net/c/b?sv=2022-11-02&s" + "ig=" + sas, sas),
        "azure_client_secret": (r(3) + "8Q" + "~" + r(34),) * 2,
        "password": ("PASS" + "WORD=" + pw, pw),
        "db_pass": ("DB_" + "PASS: " + dbpass, dbpass),
        "secret_assignment": ("SERVICE_API_" + "KEY=" + apikey, apikey),
        "url_password": ("postgres://admin:" + url_pw + "@db.internal:5432/app", url_pw),
    }
    return shapes


NEAR_MISSES = [
    "commit 3f9a1c0b6e2d4f8a9b7c5d3e1f0a2b4c6d8e0f1a",  # a git SHA
    "request id 550e8400-e29b-41d4-a716-446655440000",  # a UUID
    "def connect(password: str) -> None:\n    password = os.environ['DB_PASSWORD']\n    if password is None:\n",
    "SORT_KEY=created_at_timestamp\nLOG_LEVEL=info\n",
    "    token = self.next_token()\n    self.api_key = api_key\n",
    "PASSWORD=${DB_PASSWORD}\n",
    "const skipped = items.filter(x => x.key !== undefined); // sk-learn notes\n",
]


@pytest.fixture(scope="module")
def redactor() -> Redactor:
    return Redactor(b"test key")


@pytest.mark.parametrize("kind", sorted(corpus()))
def test_each_kind_is_found_and_replaced(redactor, kind):
    text, secret = corpus()[kind]
    message = f"here is the file:\n{text}\nthanks"
    redacted, found = redactor.redact(message)
    assert found, kind
    assert secret not in redacted
    assert "[REDACTED:" in redacted or "[R:" in redacted
    # The same text inside JSON (a message as the trace stores it): found there too.
    encoded, found_in_json = redactor.redact(json.dumps({"content": message}))
    assert found_in_json and secret not in encoded and json.dumps(secret)[1:-1] not in encoded


@pytest.mark.parametrize("text", NEAR_MISSES)
def test_near_misses_are_left_alone(redactor, text):
    assert redactor.find(text) == []
    assert redactor.redact(text)[0] == text


def test_a_secret_gets_one_marker_everywhere_and_another_secret_another(redactor):
    first, second = corpus(1)["github_token"][0], corpus(2)["github_token"][0]
    text, _ = redactor.redact(f"a {first} b {first} c {second}")
    markers = [w for w in text.split() if w.startswith("[REDACTED:")]
    assert len(markers) == 3 and markers[0] == markers[1] != markers[2]
    assert markers[0].startswith("[REDACTED:github_token:")
    # Under another key, another hash: the marker cannot be computed without the server's secret.
    assert Redactor(b"another key").redact(first)[0] != redactor.redact(first)[0]


def test_keep_length_keeps_every_offset_and_slices_redact_alike(redactor):
    shapes = corpus()
    text = "\n".join(f"line {i}: {t}" for i, (t, _) in enumerate(shapes.values())) + "\nend"
    redacted, found = redactor.redact(text, keep_length=True)
    assert len(redacted) == len(text) and len(found) >= len(shapes)
    for _, secret in shapes.values():
        assert secret not in redacted
    # A prompt's added part is redacted alone (the part before it was, last turn): the same characters.
    cut = text.index("line 10:")
    assert redacted[cut:] == redactor.redact(text[cut:], keep_length=True)[0]


# -- through a server ---------------------------------------------------------------------------------

EXEC = {"type": "function", "function": {"name": "exec", "description": "Run a command.",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}}


class Receiver:
    """An OTLP/HTTP receiver that keeps each export's body as it came (protobuf: strings are UTF-8 in it)."""

    def __init__(self) -> None:
        bodies = self.bodies = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                bodies.append(gzip.decompress(body) if self.headers.get("Content-Encoding") == "gzip" else body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Kept:
    """The store a server under test writes (`kind`: SQLite files in `folder`, or a fresh schema of the
    tests' PostgreSQL database), and all that it holds, as bytes."""

    def __init__(self, made: store_kinds.Stores, folder) -> None:
        self.kind, self.folder, self._made = made.kind, folder, made
        self.setting = str(folder / "traces.sqlite3") if made.kind == "sqlite" else made.setting()

    def everything(self) -> bytes:
        """SQLite: every byte of the store's files (traces and state, each with its -wal and -shm).
        PostgreSQL: every value of every row of every table in the schema, bytea as its raw bytes and the
        rest as text, and the schema's `pg_dump` (what a backup of it holds)."""
        if self.kind == "sqlite":
            files = [p for p in self.folder.iterdir() if p.name.startswith(("traces.sqlite3", "traces.state.sqlite3"))]
            assert {"traces.sqlite3", "traces.state.sqlite3", "traces.state.sqlite3-wal"} <= {p.name for p in files}
            return b"".join(p.read_bytes() for p in files)
        import psycopg

        schema = self.setting.rsplit("%3D", 1)[-1]
        found = []
        with psycopg.connect(self.setting, autocommit=True) as conn:
            tables = [row[0] for row in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s "
                "AND table_type = 'BASE TABLE'", (schema,))]
            kept = {"spans", "traces", "trace_text", "sessions", "state_responses", "state_turns"}
            assert kept <= set(tables), tables
            for table in tables:
                for row in conn.execute(f'SELECT * FROM "{schema}"."{table}"'):
                    found.extend(v if isinstance(v, bytes) else bytes(v) if isinstance(v, memoryview)
                                 else str(v).encode() for v in row if v is not None)
        dump = subprocess.run(["pg_dump", "--no-owner", "--schema", schema, "--dbname", self.setting],
                              capture_output=True, timeout=120)
        assert dump.returncode == 0 and f"CREATE TABLE {schema}.spans".encode() in dump.stdout, dump.stderr
        return b"\n".join(found) + dump.stdout

    def state_rows(self, statement: str) -> list[tuple]:
        """A statement on the state store's tables (SQLite's state file; PostgreSQL's schema)."""
        if self.kind == "sqlite":
            with sqlite3.connect(self.folder / "traces.state.sqlite3") as db:
                return db.execute(statement).fetchall()
        import psycopg

        with psycopg.connect(self.setting, autocommit=True) as conn:
            return [tuple(row) for row in conn.execute(statement)]


@pytest.fixture(scope="module", params=store_kinds.KINDS)
def store_kind(request, tmp_path_factory):
    """A fixture's store, on each kind (PostgreSQL's skipped where the tests have none: conftest.py)."""
    folder = tmp_path_factory.mktemp(f"redaction-{request.param}")
    made = store_kinds.of_param(request, folder)
    yield Kept(made, folder)
    made.close()


def _serve(model_dir, kept: Kept, **settings) -> AppThread:
    placeholder = kept.folder / "none.jsonl"
    placeholder.write_text('{"text": "unused"}\n')
    return AppThread(Settings(model=str(model_dir), backend="replay", replay=str(placeholder),
                              served_model_name=MODEL, trace_db=kept.setting, **settings)).start()


@pytest.fixture(scope="module")
def served(qwen3_5_dir, store_kind):
    receiver = Receiver()
    app = _serve(qwen3_5_dir, store_kind, otlp_endpoint=receiver.url)
    yield app, store_kind, receiver
    app.stop()
    receiver.close()


def _read_everything(app: AppThread, *texts: str) -> Reading:
    """The next requests get these outputs, one each; the prompts the engine read are kept."""
    reading = Reading(ReplayBackend([{"text": t} for t in texts], app.runtime.vocab))
    app.runtime.backend = reading
    return reading


def _export(kept: Kept, fmt: str) -> str:
    """An export's text; a Parquet file's (compressed) rows read back as JSON Lines."""
    parser = argparse.ArgumentParser()
    export_arguments(parser)
    parquet = fmt in ("parquet", "prime-rl")
    store, out_file = kept.setting, str(kept.folder / f"export.{fmt}.parquet")
    args = parser.parse_args(["--store", store, "--since", "0", "--format", fmt, *(["--out", out_file] * parquet)])
    out, opened = io.StringIO(), []

    def reader(spec: str):  # the command, a process of its own, never closes it: a test in this one does
        opened.append(open_reader(spec))
        return opened[-1]
    try:
        with contextlib.redirect_stdout(out), mock.patch.object(export_command, "open_reader", reader):
            assert run_export(args) == 0
    finally:
        for store in opened:
            getattr(store, "close", lambda: None)()
    if not parquet:
        return out.getvalue()
    import pyarrow.parquet as pq

    return "\n".join(json.dumps(row, default=str) for row in pq.read_table(out_file).to_pylist())


def _gemini(env: str) -> dict:
    return {"tools": [{"functionDeclarations": [{"name": "exec", "parameters": EXEC["function"]["parameters"]}]}],
            "contents": [{"role": "user", "parts": [{"text": "env:\n" + env}]},
                         {"role": "model", "parts": [{"functionCall": {"name": "exec", "args": {"cmd": env}}}]},
                         {"role": "user", "parts": [{"functionResponse": {"name": "exec",
                                                                          "response": {"output": env}}}]}]}


def _state_unsealed(kept: Kept, tokenizer) -> str:
    """The state store's records as one who copied it would read them without the key secret: JSON blobs
    decompressed, a turn's packed ids decoded. Its responses and turns are there (else this reads nothing)."""
    found = []
    blobs = [*kept.state_rows("SELECT conversation, response FROM state_responses"),
             *kept.state_rows("SELECT summary FROM state_compactions")]
    turns = [row[0] for row in kept.state_rows("SELECT ids FROM state_turns")]
    assert len(blobs) >= 2 and turns, (len(blobs), len(turns))
    for blob in (bytes(b) for row in blobs for b in row):
        with contextlib.suppress(zlib.error):
            found.append((zlib.decompress(blob[1:]) if blob[:1] == b"z" else blob[1:]).decode(errors="replace"))
    for ids in turns:
        found.append(tokenizer.decode([i for i in array("i", bytes(ids)[:len(ids) // 4 * 4]) if 0 <= i < 250000]))
    return "\n".join(found)


def _gemini_mounted(app: AppThread) -> bool:
    return any(r.canonical.startswith("/v1beta/") for r in app.app.router.resources())


def _websocket(app: AppThread, *bodies: dict) -> None:
    """Responses over one socket, each continuing the one before (previous_response_id)."""
    from websockets.sync.client import connect

    previous = None
    with connect(app.url.replace("http", "ws") + "/v1/responses", max_size=None) as socket:
        for body in bodies:
            socket.send(json.dumps({"type": "response.create", **body,
                                    **({"previous_response_id": previous} if previous else {})}))
            while (event := json.loads(socket.recv()))["type"] not in ("response.completed", "response.failed",
                                                                      "error"):
                pass
            assert event["type"] == "response.completed", event
            previous = event["response"]["id"]


def _send_corpus(app: AppThread, kept: Kept, caplog) -> tuple[list[str], bytes, str, dict, list[str]]:
    """The corpus sent in every place a request carries text, over each API: every request answered 200
    and the model given the real text. Then the secrets, and what was kept: the trace files' bytes, the
    log, each export format, and the exported token ids decoded."""
    shapes = corpus(7)
    secrets = [secret for _, secret in shapes.values()]
    env = "\n".join(text for text, _ in shapes.values())
    caplog.set_level(logging.DEBUG)
    written = corpus(8)["github_token"][1]  # one the model writes itself: its token events hold it
    secrets.append(written)
    answers = ["\n</think>\n\nSet GITHUB_TOKEN to " + written + " then.<|im_end|>"] + ["\n</think>\n\nDone.<|im_end|>"] * 8
    reading = _read_everything(app, *answers)
    chat = {"model": MODEL, "tools": [EXEC], "messages": [
        {"role": "user", "content": "Here is my .env:\n" + env},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "exec", "arguments": json.dumps({"cmd": env})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": env},
    ]}
    status, _, body = app.post(chat, path="/v1/chat/completions")
    assert status == 200, body
    assert written in json.loads(body)["choices"][0]["message"]["content"]  # the client gets what was written
    tool = {"type": "function", "name": "exec", "parameters": EXEC["function"]["parameters"]}
    responses = {"model": MODEL, "tools": [tool],
                 "input": [{"type": "message", "role": "user", "content": "env:\n" + env},
                           {"type": "function_call", "call_id": "c2", "name": "exec",
                            "arguments": json.dumps({"cmd": env})},
                           {"type": "function_call_output", "call_id": "c2", "output": env}]}
    status, _, body = app.post({**responses, "store": True}, path="/v1/responses")
    assert status == 200, body
    # Continued from the stored response (kept sealed in the state store): the model reads it all again.
    first_id = json.loads(body)["id"]
    status, _, body = app.post({"model": MODEL, "store": True, "previous_response_id": first_id,
                                "input": "and the secret key once more?"}, path="/v1/responses")
    assert status == 200, body
    status, items = app.call("GET", f"/v1/responses/{first_id}/input_items")  # the client's own, read back whole
    assert status == 200 and env.splitlines()[0] in json.dumps(items), items
    messages = {"model": MODEL, "max_tokens": 16, "messages": [
        {"role": "user", "content": "env:\n" + env},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t3", "name": "exec", "input": {"cmd": env}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t3", "content": env}]}]}
    status, _, body = app.post(messages, path="/v1/messages")
    assert status == 200, body
    _websocket(app, responses, {"model": MODEL, "input": [{"type": "message", "role": "user", "content": "again"}]})
    if _gemini_mounted(app):
        status, _, body = app.post(_gemini(env), path=f"/v1beta/models/{MODEL}:generateContent")
        assert status == 200, body
    # The model read the real text: redaction is of what is kept, not of what is served.
    read = [app.runtime.tokenizer.decode(ids) for ids in reading.read]
    assert len(read) == 6 + _gemini_mounted(app)
    for prompt in read:
        for secret in secrets[:-1]:
            assert secret in prompt or secret.replace("\n", "\\n") in prompt
    app.settled()
    # All the store holds: the traces and the state beside them (Kept.everything).
    stored = kept.everything() + _state_unsealed(kept, app.runtime.tokenizer).encode()
    log = caplog.text
    exports = {fmt: _export(kept, fmt)
               for fmt in ("jsonl", "parquet", "verl", "skyrl", "prime-rl", "nemo-gym", "tinker", "atif")}
    decoded = []
    for text in (exports["jsonl"], exports["verl"]):
        for line in text.splitlines():
            row = json.loads(line)
            for key in ("prompt_ids", "completion_ids", "response_ids"):
                if row.get(key):
                    decoded.append(app.runtime.tokenizer.decode(row[key]))
    assert decoded
    return secrets, stored, log, exports, decoded


def test_no_secret_reaches_the_store_the_log_or_an_export(served, caplog):
    app, kept, receiver = served
    secrets, stored, log, exports, decoded = _send_corpus(app, kept, caplog)
    assert b"[REDACTED:" in stored  # the store was read: the corpus is there, redacted
    assert any("[REDACTED:" in text for text in exports.values())
    # Every step here held a credential: exported masked 0 throughout, and ATIF says it is not token-exact.
    rows = [json.loads(line) for fmt in ("jsonl", "verl") for line in exports[fmt].splitlines()]
    assert rows and all(not any(row.get("mask") or row.get("response_mask")) for row in rows)
    assert "credentials in it were redacted" in exports["atif"]
    assert app.app[TELEMETRY].flush()
    sent = b"".join(receiver.bodies)
    assert b"[REDACTED:" in sent
    for secret in secrets:
        encoded = [secret.encode(), base64.b64encode(secret.encode()), base64.urlsafe_b64encode(secret.encode())]
        for form in encoded:
            assert form not in sent, secret
            assert form not in stored, secret
            assert form.decode() not in log
            for fmt, text in exports.items():
                assert form.decode() not in text, (fmt, secret)
        for text in decoded:
            assert secret not in text, secret


def test_the_gemini_api_is_in_the_corpus(served):
    """Said apart, so a server without the Gemini API's routes reports the corpus's gap as a skip."""
    if not _gemini_mounted(served[0]):
        pytest.skip("the Gemini API's routes are not mounted (proxy/api/app.py): the corpus ran without them")
    assert served[0].call("GET", "/v1beta/models")[0] == 200


@pytest.fixture(params=store_kinds.KINDS)
def fresh_store(request, tmp_path):
    made = store_kinds.of_param(request, tmp_path)
    yield Kept(made, tmp_path)
    made.close()


def test_with_redact_off_the_same_requests_keep_every_secret_and_say_so(qwen3_5_dir, fresh_store, caplog):
    """The check above can fail: with `--redact off` the same corpus is found in the store (its files, or
    its rows and dump) and the exports."""
    caplog.set_level(logging.WARNING)
    app = _serve(qwen3_5_dir, fresh_store, redact=False)
    try:
        assert "--redact off" in caplog.text
        secrets, stored, _, exports, decoded = _send_corpus(app, fresh_store, caplog)
    finally:
        app.stop()
    assert all(secret.encode() in stored for secret in secrets if "\n" not in secret)
    assert all(secret in exports["atif"] for secret in secrets if "\n" not in secret)
    assert all(any(secret in text for text in decoded) for secret in secrets)
