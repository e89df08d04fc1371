"""`looptrace replay` and `looptrace export` answer what they cannot do in one line on standard error
and exit 2, never with a traceback (issue 35, findings 3 and 4). Each case ran the real command line
and ended in a traceback and exit 1 before: an empty `--session` (a TypeError), a `--store` file that
does not exist, a PostgreSQL store with a wrong password or none listening (psycopg-pool's warnings,
then a traceback after 3-4 s), a target answering 200 with an HTML page (UnicodeDecodeError), a
target whose /v1/score answers a well-formed wrong shape (KeyError: 'greedy_id'). And `--target`
takes http(s) URLs only (`file:///etc/passwd` was read) and follows no redirect (a 302 to
169.254.169.254 was followed); its per-request timeout is 60 s, said in --help, no longer 600.

The targets here are small HTTP servers on loopback that answer as a broken or hostile server would:
what no real looptrace or vLLM does on demand.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from processes import free_port
from replays import looptrace

SESSION = "command-line-failures"
Handler = Callable[[http.server.BaseHTTPRequestHandler], None]


@pytest.fixture(scope="module")
def store(replay_app) -> str:
    """A SQLite store holding one recorded session of one step (the tiny Qwen3.5, replay backend)."""
    replay_app.replay("Hello there.<|im_end|>")
    status, answer = replay_app.call("POST", "/v1/chat/completions", {
        "model": "tiny-qwen", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8},
        {"session_id": SESSION})
    assert status == 200, answer
    replay_app.stored(f"/v1/sessions/{SESSION}")
    return replay_app.settings.trace_db


def one_line_exit_2(done, command: str, *found: str) -> str:
    """The command failed as a person should see it: exit 2, one line on stderr, saying `found`."""
    said = done.stderr.strip()
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr and len(said.splitlines()) == 1, done.stderr
    assert said.startswith(f"looptrace {command}: "), said
    for part in found:
        assert part in said, said
    return said


def replay(store: str, target: str, tmp_path, *extra: str, session: str = SESSION):
    return looptrace("replay", "--store", store, "--session", session, "--target", target,
                     "--report", str(tmp_path / "report.json"), *extra, timeout=120)


def export(store: str, *extra: str):
    return looptrace("export", "--store", store, *extra, timeout=120)


@pytest.fixture
def serve_http() -> Iterator[Callable[[Handler], str]]:
    """Starts an HTTP server on loopback answering every GET and POST with `handler`; its URL."""
    servers = []

    def start(handler: Handler) -> str:
        class One(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's names
                handler(self)

            do_POST = do_GET

            def log_message(self, *args):
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), One)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()


def answer(request: http.server.BaseHTTPRequestHandler, status: int, body: bytes, kind: str = "application/json",
           **headers: str) -> None:
    length = int(request.headers.get("Content-Length") or 0)
    request.rfile.read(length)
    request.send_response(status)
    request.send_header("Content-Type", kind)
    request.send_header("Content-Length", str(len(body)))
    for name, value in headers.items():
        request.send_header(name, value)
    request.end_headers()
    request.wfile.write(body)


# -- finding 3: the six cases --------------------------------------------------------------------------


def test_export_of_an_empty_session_key_says_so(store):
    one_line_exit_2(export(store, "--session", ""), "export", "--session is empty")


def test_a_store_file_that_does_not_exist_is_named_by_both_commands(store, tmp_path):
    missing = str(tmp_path / "no-such-traces.sqlite3")
    one_line_exit_2(export(missing, "--session", SESSION), "export", "no such file", missing)
    one_line_exit_2(replay(missing, "http://127.0.0.1:9", tmp_path), "replay", "no such file", missing)
    assert not (tmp_path / "no-such-traces.sqlite3").exists()  # nothing was created in its place


def _wrong_password(url: str) -> str:
    head, rest = url.split("://", 1)
    user, host = rest.split("@", 1)
    return f"{head}://{user.split(':', 1)[0]}:not-the-password@{host}"


@pytest.mark.parametrize("which", ["wrong password", "nothing listening"])
def test_a_postgresql_store_that_refuses_or_is_down_fails_fast_in_one_line(postgres_url, tmp_path, which):
    url = _wrong_password(postgres_url) if which == "wrong password" else \
        f"postgresql://looptrace_test:secret@127.0.0.1:{free_port()}/looptrace_test"
    for command, done in (("export", lambda: export(url, "--session", SESSION)),
                          ("replay", lambda: replay(url, "http://127.0.0.1:9", tmp_path))):
        began = time.monotonic()
        said = one_line_exit_2(done(), command, "cannot connect to postgresql://looptrace_test@127.0.0.1")
        assert time.monotonic() - began < 15, said  # one attempt, not a pool's retries
        assert ("password authentication failed" if which == "wrong password" else "refused") in said
        assert "not-the-password" not in said and "secret" not in said


def test_a_target_answering_an_html_page_is_said_in_one_line(store, tmp_path, serve_http):
    page = "<!doctype html><html><body>Caf\u00e9 portal: sign in</body></html>".encode("latin-1")
    url = serve_http(lambda r: answer(r, 200, page, "text/html; charset=latin-1"))
    one_line_exit_2(replay(store, url, tmp_path), "replay", "does not list a model at /v1/models")


def _looptrace_like(scores: object) -> Handler:
    """Answers /health and /v1/models as looptrace does, and /v1/score with `scores`."""
    def handle(request):
        if request.path == "/health":
            body = {"status": "ready", "model": "tiny-qwen", "backend": "local"}
        elif request.path == "/v1/models":
            body = {"object": "list", "data": [{"id": "tiny-qwen", "object": "model", "max_model_len": 4096}]}
        else:
            body = scores
        answer(request, 200, json.dumps(body).encode())
    return handle


@pytest.mark.parametrize("scores", [
    {"tokens": [{"id": 1, "logprob": -0.1, "rank": 1}] * 4},  # no greedy_id
    {"tokens": "none"}, {"scores": []}, [1, 2], {"tokens": [{"greedy_id": "x", "rank": 1, "logprob": 0,
                                                             "greedy_logprob": 0}] * 4},
], ids=["no greedy_id", "tokens a string", "no tokens", "a list", "greedy_id a string"])
def test_a_target_scoring_in_a_wrong_shape_is_said_in_one_line(store, tmp_path, serve_http, scores):
    url = serve_http(_looptrace_like(scores))
    one_line_exit_2(replay(store, url, tmp_path), "replay", "answered /v1/score in a shape this replay cannot read")


# -- finding 4: what --target takes --------------------------------------------------------------------


@pytest.mark.parametrize("target", ["file:///etc/passwd", "ftp://127.0.0.1/x", "data:,hello", "127.0.0.1:8000",
                                    "http://"])
def test_a_target_that_is_not_an_http_url_is_refused(store, tmp_path, target):
    said = one_line_exit_2(replay(store, target, tmp_path), "replay", "--target must be an http:// or https:// URL")
    assert "root:" not in said


def test_a_redirecting_target_is_not_followed(store, tmp_path, serve_http):
    reached = []
    elsewhere = serve_http(lambda r: (reached.append(r.path), answer(r, 200, b'{"status": "ready"}')))
    url = serve_http(lambda r: answer(r, 302, b"", Location=elsewhere + r.path))
    one_line_exit_2(replay(store, url, tmp_path), "replay", "redirect (302", "does not follow redirects")
    assert reached == []
    metadata = serve_http(lambda r: answer(r, 302, b"", Location="http://169.254.169.254/latest/meta-data/"))
    one_line_exit_2(replay(store, metadata, tmp_path), "replay", "169.254.169.254")


def test_the_default_timeout_is_one_a_person_waits_for_and_help_says_it(store, tmp_path):
    done = looptrace("replay", "--help", timeout=60)
    assert done.returncode == 0
    assert "default 60 s" in " ".join(done.stdout.split()), done.stdout
    silent = free_port()
    import socket

    with socket.socket() as listener:  # accepts the connection, never answers
        listener.bind(("127.0.0.1", silent))
        listener.listen(8)
        began = time.monotonic()
        one_line_exit_2(replay(store, f"http://127.0.0.1:{silent}", tmp_path, "--timeout", "2"), "replay",
                        "cannot reach the target", "timed out")
        assert time.monotonic() - began < 30



# -- issue 41, L2: export's store and --out ------------------------------------------------------------


def test_l2_export_of_a_sqlite_file_without_the_schema_says_so(tmp_path):
    import sqlite3

    other = tmp_path / "other.sqlite3"
    sqlite3.connect(other).execute("CREATE TABLE notes (text)").connection.close()
    empty = tmp_path / "empty.sqlite3"
    empty.touch()
    for path in (other, empty):
        one_line_exit_2(export(str(path), "--session", SESSION), "export", str(path), "without looptrace's tables")
        one_line_exit_2(replay(str(path), "http://127.0.0.1:9", tmp_path), "replay", "without looptrace's tables")


def test_l2_export_of_an_empty_postgresql_database_says_so(postgres_url):
    import postgres

    empty = postgres.fresh_schema(postgres_url)  # a database (its schema) no looptrace wrote to
    said = one_line_exit_2(export(empty, "--since", "0"), "export", "holds no looptrace tables")
    assert postgres_url.split("://")[1].split("@")[0] not in said  # no password


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "verl", "prime-rl"])
def test_l2_export_out_into_a_missing_folder_or_one_it_cannot_write_says_so(store, tmp_path, fmt):
    cases = [(str(tmp_path / "no-such-folder" / "rows.out"), "there is no folder"),
             (str(tmp_path), "is a folder"),
             (str(tmp_path / "a-file" / "rows.out"), "there is no folder")]
    (tmp_path / "a-file").write_text("")
    if fmt in ("jsonl", "verl"):  # a device that is always full: the failure comes when writing, not opening
        cases.append(("/dev/full", "cannot write --out /dev/full: No space left on device"))
    for out, says in cases:
        one_line_exit_2(export(store, "--session", SESSION, "--format", fmt, "--out", out), "export", says)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]  # nothing made on the way


def test_export_to_a_reader_that_stops_early_ends_quietly(store):
    """`looptrace export ... | head -1`: the reader closes the pipe; the export exits 0, saying nothing."""
    import subprocess

    from replays import looptrace_command

    with subprocess.Popen([*looptrace_command(), "export", "--store", store, "--session", SESSION],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as export_process:
        export_process.stdout.close()  # before a byte is read: every write meets a closed pipe
        _, stderr = export_process.communicate(timeout=120)
    assert export_process.returncode == 0 and stderr == b"", (export_process.returncode, stderr)


# -- issue 41, L3: serve's flags -----------------------------------------------------------------------


@pytest.mark.parametrize(("flags", "says"), [
    (["--render-cache-mb", "nan"], "argument --render-cache-mb: 'nan' is not a number, 0 or more"),
    (["--render-cache-mb", "-1"], "argument --render-cache-mb: '-1' is not a number, 0 or more"),
    (["--render-cache-mb", "inf"], "argument --render-cache-mb: 'inf'"),
    (["--render-check-every", "-1"], "argument --render-check-every: '-1' is not an integer, 0 or more"),
    (["--port", "70000"], "argument --port: '70000' is not a port"),
    (["--trace-max-mb", "nan"], "argument --trace-max-mb"),
    (["--media-fetch-timeout", "0"], "argument --media-fetch-timeout"),
    (["--prefix-cache-mb", "nan"], "argument --prefix-cache-mb"),
    (["--backend", "vllm", "--vllm-url", "http://127.0.0.1:9", "--vllm-kv-events", "tcp://[::1"],
     "--vllm-kv-events 'tcp://[::1'"),
    (["--backend", "vllm", "--vllm-url", "http://127.0.0.1:9", "--vllm-kv-events", "tcp://gpu-a:99999"],
     "each tcp://HOST:PORT"),
    (["--backend", "vllm", "--vllm-url", "http://127.0.0.1:9", "--vllm-timeout", "nan"], "argument --vllm-timeout"),
    (["--backend", "replay", "--replay", "x.jsonl", "--threads", "2"], "--threads is for --backend llama.cpp"),
    (["--trace-db", "/etc/hostname/traces.sqlite3"], "/etc/hostname is a file"),
    (["--trace-db", "/tmp"], "--trace-db /tmp is a folder"),
], ids=["cache nan", "cache -1", "cache inf", "check every -1", "port", "trace mb nan", "fetch timeout 0",
        "prefix cache nan", "kv events ipv6 unclosed", "kv events port", "vllm timeout nan", "other backend's",
        "store under a file", "store a folder"])
def test_l3_each_serve_flag_error_is_one_line_and_exit_2_at_once(tmp_path, flags, says):
    began = time.monotonic()
    done = looptrace("serve", "--trace-db", str(tmp_path / "traces.sqlite3"), *flags, timeout=60)
    one_line_exit_2(done, "serve", says)
    assert time.monotonic() - began < 30  # refused as it is read, before a model or a store is opened
    assert list(tmp_path.iterdir()) == []
