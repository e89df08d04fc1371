"""How requests group into sessions (issue 56, item 6; api/clients.py's SESSION_HEADERS, then
api/history_sessions.py), through the real app on the replay backend with two tenants' keys: each
session header alone groups two unrelated requests, as does the body's prompt_cache_key; a request
that names none joins the session whose last prompt and answer it extends (a tool-call loop) and
starts one of its own otherwise; another tenant's identical history joins nothing of the first's."""

from __future__ import annotations

import json
import urllib.parse
import uuid

import pytest

from looptrace.proxy.api.clients import CONVERSATION_HEADERS, MAX_ROLLOUT_CHARS
from looptrace.proxy.api.history_sessions import HISTORY, HistorySessions
from looptrace.proxy.api.keys import TELEMETRY
from looptrace.proxy.settings import Settings
from looptrace.trace_store.api_keys import SECRET_ENV, KeyStore, server_secret

import hostile_tenant as hostile
from app_thread import AppThread

MODEL = "tiny"
CALL = ("Let me look.\n</think>\n\n<tool_call>\n<function=read_file>\n<parameter=path>\nsrc/app.py\n</parameter>\n"
        "</function>\n</tool_call><|im_end|>")
DONE = "\n</think>\n\nThe file defines main().<|im_end|>"
TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file.", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]


@pytest.fixture(scope="module")
def server(qwen3_5_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("grouping")
    (folder / "none.jsonl").write_text('{"text": "unused"}\n')
    with pytest.MonkeyPatch.context() as env:
        env.setenv(SECRET_ENV, "grouping-test-secret")  # never this machine's own secret file
        app = AppThread(Settings(model=str(qwen3_5_dir), backend="replay", replay=str(folder / "none.jsonl"),
                                 served_model_name=MODEL, trace_db=str(folder / "traces.sqlite3"),
                                 api_key="operator-key")).start()
        keys = KeyStore(app.app[TELEMETRY].state, server_secret())
        yield app, {"alice": keys.create("alice"), "bob": keys.create("bob")}
        app.stop()


def chat(app, key: str, messages: list[dict], headers: dict | None = None, answer: str = DONE, **body) -> dict:
    app.replay(answer)
    status, sent = hostile.call(app.url, key, "POST", "/v1/chat/completions",
                                {"model": MODEL, "messages": messages, "tools": TOOLS, **body}, headers)
    assert status == 200, sent
    return json.loads(sent)


def sessions_with(app, key: str, marker: str) -> list[dict]:
    """The sessions `key` sees whose steps hold `marker`, each with its steps."""
    app.settled()
    listing = hostile.answered(app.url, key, "GET", f"/v1/sessions?limit=50&q={marker}")["data"]
    return [hostile.answered(app.url, key, "GET", "/v1/sessions/?key=" + urllib.parse.quote(row["key"]))
            for row in listing]


def user(text: str) -> list[dict]:
    return [{"role": "system", "content": "You read code."}, {"role": "user", "content": text}]


def tool_loop(app, key: str, marker: str, headers: dict | None = None) -> tuple[list[dict], dict]:
    """Request 1 (answered with a call), and the messages request 2 sends: request 1's, looptrace's
    answer with the call id it minted, and the tool's result."""
    messages = user(f"What is in src/app.py? {marker}")
    first = chat(app, key, messages, headers, answer=CALL)
    answer = first["choices"][0]["message"]
    call = answer["tool_calls"][0]
    assert call["id"].startswith("call_")
    return messages + [answer, {"role": "tool", "tool_call_id": call["id"], "content": "def main(): pass"}], first


HEADER_CASES = [({name: "s-" + uuid.uuid4().hex}, {}, name) for name in CONVERSATION_HEADERS] + [
    ({"X-Session-Id": "s-" + uuid.uuid4().hex}, {}, "x-session-id"),  # as Crush writes it
    ({}, {"prompt_cache_key": "k-" + uuid.uuid4().hex}, "prompt_cache_key"),
]


@pytest.mark.parametrize(("headers", "body", "how"), HEADER_CASES, ids=[c[2] for c in HEADER_CASES])
def test_each_session_header_alone_groups_two_unrelated_requests(server, headers, body, how):
    app, keys = server
    marker = "m" + uuid.uuid4().hex
    chat(app, keys["alice"], user(f"first {marker}"), headers, **body)
    chat(app, keys["alice"], user(f"second, unrelated {marker}"), headers, **body)
    found = sessions_with(app, keys["alice"], marker)
    assert len(found) == 1 and len(found[0]["steps"]) == 2, found
    assert found[0]["conversation"] == "alice/" + (*headers.values(), *body.values())[0]
    assert [s.get("grouped_by") for s in found[0]["steps"]] == [how, how]


def test_a_label_no_viewer_should_show_is_passed_over_for_the_next_header(server):
    app, keys = server
    marker, named = "m" + uuid.uuid4().hex, "s-" + uuid.uuid4().hex
    for bad in ("x" * (MAX_ROLLOUT_CHARS + 1), "evil\u0085name"):  # too long; a control character
        chat(app, keys["alice"], user(f"{marker} {len(bad)}"), {"x-session-affinity": bad, "session_id": named})
    found = sessions_with(app, keys["alice"], marker)
    assert [(s["conversation"], [st.get("grouped_by") for st in s["steps"]]) for s in found] == [
        ("alice/" + named, ["session_id", "session_id"])]


def test_no_header_but_a_growing_history_is_one_session(server):
    app, keys = server
    marker = "m" + uuid.uuid4().hex
    messages, _ = tool_loop(app, keys["alice"], marker)
    second = chat(app, keys["alice"], messages)
    # A third turn: the second's answer and another question, its arguments' JSON re-serialized.
    messages[2]["tool_calls"][0]["function"]["arguments"] = json.dumps(
        json.loads(messages[2]["tool_calls"][0]["function"]["arguments"]), indent=2)
    chat(app, keys["alice"], messages + [second["choices"][0]["message"], {"role": "user", "content": "And?"}])
    found = sessions_with(app, keys["alice"], marker)
    assert len(found) == 1 and len(found[0]["steps"]) == 3, found
    assert [s.get("grouped_by") for s in found[0]["steps"]] == [HISTORY] * 3
    assert found[0]["key"] == "trace:" + found[0]["steps"][0]["trace_id"]  # named by its first request


def test_a_call_id_looptrace_minted_joins_a_rewritten_history(server):
    app, keys = server
    marker = "m" + uuid.uuid4().hex
    messages, _ = tool_loop(app, keys["alice"], marker)
    messages[0]["content"] = "You read code. Today is another day."  # the client rewrote its system prompt
    chat(app, keys["alice"], messages)
    found = sessions_with(app, keys["alice"], marker)
    assert len(found) == 1 and len(found[0]["steps"]) == 2, found


def test_an_unrelated_conversation_starts_a_session_of_its_own(server):
    app, keys = server
    marker = "m" + uuid.uuid4().hex
    tool_loop(app, keys["alice"], marker)
    chat(app, keys["alice"], user(f"Something else entirely. {marker}"))
    # The same question again, with an answer looptrace never gave: no session of the first's.
    chat(app, keys["alice"], user(f"What is in src/app.py? {marker}") + [
        {"role": "assistant", "content": "Let me look."}, {"role": "user", "content": "Go on."}])
    found = sessions_with(app, keys["alice"], marker)
    assert sorted(len(s["steps"]) for s in found) == [1, 1, 1], found


def test_another_tenants_identical_history_does_not_join(server):
    app, keys = server
    marker = "m" + uuid.uuid4().hex
    messages, _ = tool_loop(app, keys["alice"], marker)
    chat(app, keys["bob"], messages)  # alice's history, her call id included, sent with bob's key
    assert [len(s["steps"]) for s in sessions_with(app, keys["bob"], marker)] == [1]
    assert [len(s["steps"]) for s in sessions_with(app, keys["alice"], marker)] == [1]


def test_the_map_is_bounded_by_count_per_tenant(monkeypatch):
    """A tenant's map holds at most MAX_ENTRIES digests; the oldest go first and another tenant's stay."""
    from looptrace.proxy.api import history_sessions
    monkeypatch.setattr(history_sessions, "MAX_ENTRIES", 3)
    sessions = HistorySessions()
    history = [{"role": "user", "content": "hi"}]
    kept = sessions.join("b", history, "b0")
    sessions.keep("b", kept.chain, [["text", "hello"]], "trace:b0")
    for n in range(5):
        grouping = sessions.join("a", [{"role": "user", "content": f"q{n}"}], f"t{n}")
        sessions.keep("a", grouping.chain, [["text", f"a{n}"]], grouping.session)
    assert len(sessions._map("a").entries) == 3
    follow = [{"role": "user", "content": "q0"}, {"role": "assistant", "content": "a0"}, {"role": "user", "content": "?"}]
    assert not sessions.join("a", follow, "x").joined  # dropped: the oldest
    follow[0]["content"], follow[1]["content"] = "q4", " a4 "  # spacing aside, the same answer
    assert sessions.join("a", follow, "x").session == "trace:t4"
    assert sessions.join("b", history + [{"role": "assistant", "content": "hello"}], "y").session == "trace:b0"
