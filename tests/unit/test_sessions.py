"""Sessions and steps from the store: what the trace viewer lists and shows, read back over HTTP from
requests a replayed model answered, and the store's own bookkeeping (paging, retention, an older file);
on SQLite and on PostgreSQL alike."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import urllib.parse
import urllib.request

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from looptrace.proxy.settings import Settings
from looptrace.trace_store.sqlite.store import SQLiteTraceStore

import stores as store_kinds
from app_thread import AppThread

CALL = ("Let me look.\n</think>\n\n<tool_call>\n<function=read_file>\n<parameter=path>\nsrc/app.py\n</parameter>\n"
        "</function>\n</tool_call><|im_end|>")
DONE = "All good.\n</think>\n\nThe file defines main().<|im_end|>"
TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file.", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]
AGENT = {"session_id": "sess-alpha", "User-Agent": "codex_exec/0.169.0 (Linux; x86_64)"}


@pytest.fixture(scope="module", params=store_kinds.KINDS)
def replay_app(request, qwen3_5_dir, tmp_path_factory):
    """The replay application (conftest.py's), its traces in a SQLite file or in PostgreSQL: the module
    runs once on each."""
    folder = tmp_path_factory.mktemp("replay")
    made = store_kinds.of_param(request, folder)
    placeholder = folder / "none.jsonl"
    placeholder.write_text('{"text": "unused"}\n')
    app = AppThread(Settings(model=str(qwen3_5_dir), backend="replay", replay=str(placeholder),
                             served_model_name="tiny-qwen", trace_db=made.setting())).start()
    yield app
    app.stop()
    made.close()


@pytest.fixture(scope="module")
def session(replay_app):
    """Two steps of an agent's loop (a tool call, then its result and an answer), one failed request in
    the same conversation, and one request without a conversation."""
    replay_app.replay(CALL, DONE, "Hi.<|im_end|>")
    messages = [{"role": "system", "content": "You read code."}, {"role": "user", "content": "What is in src/app.py?"}]
    status, first = replay_app.call("POST", "/v1/chat/completions", {"model": "tiny-qwen", "messages": messages,
                                                                      "tools": TOOLS}, AGENT)
    assert status == 200, first
    call = first["choices"][0]["message"]["tool_calls"][0]
    messages += [first["choices"][0]["message"],
                 {"role": "tool", "tool_call_id": call["id"], "content": "def main():\n    print('zebrafish')\n"}]
    status, second = replay_app.call("POST", "/v1/chat/completions", {"model": "tiny-qwen", "messages": messages,
                                                                       "tools": TOOLS}, AGENT)
    assert status == 200, second
    status, refused = replay_app.call("POST", "/v1/chat/completions", {"model": "tiny-qwen", "messages": messages,
                                                                        "max_tokens": 10**9}, AGENT)
    assert status == 400, refused
    status, _ = replay_app.call("POST", "/v1/chat/completions", {"model": "tiny-qwen", "messages": [
        {"role": "user", "content": "hello"}]})
    assert status == 200
    listing = replay_app.stored("/v1/sessions")
    assert len(listing["data"]) >= 2 and any(r["key"] == "sess-alpha" and r["steps"] == 3 for r in listing["data"]), \
        listing
    return listing, call


def test_a_conversation_is_one_session_and_a_bare_request_its_own(session):
    listing, _ = session
    alpha = next(r for r in listing["data"] if r["key"] == "sess-alpha")
    assert (alpha["conversation"], alpha["model"], alpha["client"], alpha["client_version"]) == (
        "sess-alpha", "tiny-qwen", "codex_exec", "0.169.0")
    assert alpha["steps"] == 3 and alpha["errors"] == 1
    assert alpha["tool_calls"] == {"valid": 1, "invalid_args": 0, "unknown_tool": 0, "unparsed": 0}
    assert alpha["input_tokens"] > 0 and alpha["output_tokens"] > 0
    bare = [r for r in listing["data"] if r["conversation"] is None]
    assert len(bare) == 1 and bare[0]["key"] == f"trace:{bare[0]['last_trace_id']}" and bare[0]["steps"] == 1
    assert listing["models"] == ["tiny-qwen"] and "codex_exec" in listing["clients"]
    # Most recently active first.
    assert [r["last_ns"] for r in listing["data"]] == sorted((r["last_ns"] for r in listing["data"]), reverse=True)


def test_a_session_reads_as_the_agent_loop(replay_app, session):
    _, call = session
    found = replay_app.stored("/v1/sessions/sess-alpha")
    first, second, failed = found["steps"]
    # Step 1: the whole conversation is new; the model thought, then called a tool.
    assert [m["role"] for m in first["new_messages"]] == ["system", "user"]
    assert first["new_messages"][1]["parts"] == [{"type": "text", "content": "What is in src/app.py?"}]
    assert first["finish_reason"] == "tool_calls"
    (answer,) = first["output"]
    assert [p["type"] for p in answer["parts"]] == ["reasoning", "text", "tool_call"] or \
        [p["type"] for p in answer["parts"]] == ["reasoning", "tool_call"]
    assert answer["parts"][-1] == {"type": "tool_call", "id": call["id"], "name": "read_file",
                                   "arguments": {"path": "src/app.py"}}
    (made,) = first["tool_calls"]
    assert (made["name"], made["outcome"], made["id"]) == ("read_file", "valid", call["id"])
    assert json.loads(made["arguments"]) == {"path": "src/app.py"} and "<tool_call>" in made["raw"]
    for key in ("ttft_ms", "queue_ms", "prefill_ms", "decode_ms", "input_tokens", "output_tokens"):
        assert first[key] is not None and first[key] >= 0, key
    # Step 2: only what is new since step 1, the call echoed back and its result beside its id.
    assert second["new_from"] == 2
    assert [m["role"] for m in second["new_messages"]] == ["assistant", "tool"]
    assert second["new_messages"][1]["parts"] == [{"type": "tool_call_response", "id": call["id"],
                                                   "response": "def main():\n    print('zebrafish')\n"}]
    assert second["output"][0]["parts"][-1] == {"type": "text", "content": "The file defines main()."}
    assert second["finish_reason"] == "stop" and second["tools"] == {}
    # The refused request is a failed step, with why.
    assert failed["status"] == "error" and failed["http_status"] == 400 and failed["error"] == "context_length_exceeded"


@pytest.mark.parametrize(("q", "found"), [
    ("alpha", True),  # a piece of the conversation id
    ("zebrafish", True),  # a word of a tool's result
    ("defines main", True),  # words the model wrote
    ("platypus", False),
    ('"); DROP TABLE sessions; --', False),  # query syntax and quotes are only ever words to look for
    ("NEAR(a b) OR *", False),
])
def test_sessions_are_found_by_id_and_by_text(replay_app, session, q, found):
    listing = replay_app.stored("/v1/sessions?" + urllib.parse.urlencode({"q": q}))
    assert ("sess-alpha" in [r["key"] for r in listing["data"]]) is found


def test_filters_narrow_the_list(replay_app, session):
    by = lambda **q: [r["key"] for r in replay_app.stored("/v1/sessions?" + urllib.parse.urlencode(q))["data"]]  # noqa: E731
    assert by(client="codex_exec") == ["sess-alpha"]
    assert by(model="another") == []
    assert "sess-alpha" in by(since=str(time.time() - 600))
    assert by(since=str(time.time() + 600)) == []
    assert by(until="2001-01-01T00:00:00Z") == []
    status, error = replay_app.call("GET", "/v1/sessions?before=nonsense")
    assert status == 400 and error["error"]["param"] == "before"
    status, error = replay_app.call("GET", "/v1/sessions?since=nan")
    assert status == 400 and error["error"]["param"] == "since"


def test_an_unknown_session_is_a_404(replay_app):
    status, error = replay_app.call("GET", "/v1/sessions/no-such-session")
    assert status == 404 and error["error"]["code"] == "session_not_found"


def test_a_stored_step_arrives_on_the_live_feed(replay_app):
    """A page watching /v1/live hears of a request as soon as it is stored."""
    received: list[dict] = []
    opened = threading.Event()

    def listen() -> None:
        with urllib.request.urlopen(replay_app.url + "/v1/live", timeout=30) as response:
            opened.set()
            for line in response:
                if line.startswith(b"data:"):
                    received.append(json.loads(line[5:]))
                    if received[-1].get("session") == "sess-live":
                        return

    watcher = threading.Thread(target=listen, daemon=True)
    watcher.start()
    assert opened.wait(10)
    replay_app.replay("Live.<|im_end|>")
    sent = time.monotonic()
    status, _ = replay_app.call("POST", "/v1/chat/completions", {"model": "tiny-qwen", "messages": [
        {"role": "user", "content": "ping"}]}, {"session_id": "sess-live"})
    assert status == 200
    watcher.join(10)
    assert received and received[-1]["session"] == "sess-live", received
    assert received[-1]["output"][0]["parts"][-1]["content"] == "Live."
    assert time.monotonic() - sent < 2.0  # a stored step is announced within moments, not polled for


# -- the store itself --

def store_with(stores, **kwargs) -> tuple[object, object]:
    store = stores.make(**kwargs)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(store))
    return store, provider.get_tracer("test")


def request(tracer, conversation: str | None, start: int, **attributes) -> str:
    root = tracer.start_span("chat m", start_time=start, attributes={
        "looptrace.endpoint": "chat", "gen_ai.request.model": "m", "gen_ai.usage.input_tokens": 10,
        "gen_ai.usage.output_tokens": 2, **({"gen_ai.conversation.id": conversation} if conversation else {}),
        **attributes})
    root.end(end_time=start + 1_000_000)
    return format(root.get_span_context().trace_id, "032x")


def test_pages_walk_every_session_once(stores):
    store, tracer = store_with(stores)
    now = time.time_ns()
    for i in range(120):
        request(tracer, f"c{i:03d}", now - i * 1_000_000_000)
    request(tracer, "c000", now - 500 * 1_000_000_000)  # an old step does not make a session newer
    seen, before = [], None
    while True:
        page = store.list_sessions(limit=50, before=before)
        seen += [r["key"] for r in page["data"]]
        if not page["next"]:
            break
        stamp, _, key = page["next"].partition(":")
        before = (int(stamp), key)
    assert seen == [f"c{i:03d}" for i in range(120)]
    assert store.list_sessions(text="c000")["data"][0]["steps"] == 2


@pytest.mark.parametrize("hostile", ["a\x00b", "\ud800", "'; DROP TABLE sessions; --", "%s %% ?", "a" * 100_000])
def test_what_a_client_types_is_only_ever_looked_for(stores, hostile):
    """A search, a filter or a key is text to find, on either store: NUL and lone surrogates (which
    PostgreSQL's text cannot hold), quotes, placeholders, a very long one; never an error."""
    store, tracer = store_with(stores)
    request(tracer, "kept", time.time_ns())
    assert store.list_sessions(text=hostile)["data"] == []
    assert store.list_sessions(model=hostile, client=hostile)["data"] == []
    assert store.list_traces(conversation=hostile, model=hostile)["data"] == []
    assert store.session(hostile) is None and store.get_trace(hostile) is None and store.tokens(hostile) is None
    assert [r["key"] for r in store.list_sessions()["data"]] == ["kept"]


def test_retention_keeps_sessions_true(stores):
    store, tracer = store_with(stores, retention_seconds=3600, max_bytes=1 << 40)
    now = time.time_ns()
    request(tracer, "long", now - 5 * 3600 * 10**9)
    kept = request(tracer, "long", now - 60 * 10**9)
    request(tracer, "gone", now - 6 * 3600 * 10**9)
    store.enforce_retention()
    (long,) = store.list_sessions()["data"]
    assert (long["key"], long["steps"], long["last_trace_id"], long["first_ns"]) == ("long", 1, kept, now - 60 * 10**9)


def test_a_store_from_before_sessions_opens_and_lists(tmp_path):
    path = tmp_path / "old.sqlite3"
    db = sqlite3.connect(path)  # the first schema, as an older looptrace wrote it
    db.executescript("""
        CREATE TABLE spans (trace_id TEXT NOT NULL, span_id TEXT NOT NULL, parent_id TEXT, name TEXT NOT NULL,
            kind TEXT, start_ns INTEGER, end_ns INTEGER, status TEXT, attributes TEXT, events TEXT, links TEXT,
            PRIMARY KEY (trace_id, span_id));
        CREATE TABLE traces (trace_id TEXT PRIMARY KEY, start_ns INTEGER, end_ns INTEGER, endpoint TEXT, model TEXT,
            conversation TEXT, status TEXT, http_status INTEGER, input_tokens INTEGER, output_tokens INTEGER);
        CREATE TABLE tool_calls (call_id TEXT PRIMARY KEY, trace_id TEXT, span_id TEXT);
        INSERT INTO traces VALUES ('a', 1, 2, 'chat', 'm', 'old-conv', 'unset', 200, 5, 1);
        INSERT INTO traces VALUES ('b', 3, 4, 'chat', 'm', 'old-conv', 'error', 500, 5, 0);
        INSERT INTO traces VALUES ('c', 5, 6, 'chat', 'm', NULL, 'unset', 200, 5, 1);
    """)
    db.commit()
    db.close()
    store = SQLiteTraceStore(path)
    store.open()
    sessions = {r["key"]: r for r in store.list_sessions()["data"]}
    assert sessions["old-conv"]["steps"] == 2 and sessions["old-conv"]["errors"] == 1
    assert sessions["trace:c"]["steps"] == 1
    assert [s["trace_id"] for s in store.session("old-conv")["steps"]] == ["a", "b"]
    assert len(store.list_traces()["data"]) == 3
    store.shutdown()
