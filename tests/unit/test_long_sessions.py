"""Long agent sessions cost what is new (issue 34): a turn is tokenized from where it departs from the
turn before (families/incremental.py), and stored as what it adds to it (trace_store/chains.py),
while every read returns each step whole, exactly as a server that tokenizes and stores every prompt
whole returns it; on SQLite and PostgreSQL alike. What every family's template does turn by turn is
checked in the conformance suite (test_family_conformance.py); every integration test's server
checks each incremental encoding against a whole one (tests/support/server.py)."""

from __future__ import annotations

import json
import logging
import urllib.request
from pathlib import Path

import pytest
from agent_sessions import READ_FILE, turns
from transformers import AutoTokenizer

from looptrace.common import attributes as attr
from looptrace.families import Qwen3_5
from looptrace.families.incremental import IncrementalEncoder, KeptEncodings
from looptrace.proxy.settings import Settings
from looptrace.trace_store.records import request_span

import stores as store_kinds
from app_thread import AppThread

CALL = ("<tool_call>\n<function=read_file>\n<parameter=path>\nsrc/m{n}.py\n</parameter>\n</function>\n"
        "</tool_call><|im_end|>")
SHARED = Path(__file__).resolve().parents[3] / "shared" / "clients" / "recorded"


@pytest.fixture(scope="module")
def qwen(qwen3_5_dir) -> Qwen3_5:
    return Qwen3_5(AutoTokenizer.from_pretrained(qwen3_5_dir))


def incremental(family, check_every: int = 0):
    made = type(family)(family.tokenizer, family.generation_config)
    made.keep_encodings(1 << 28, check_every)
    return made


def test_a_template_that_drops_earlier_reasoning_departs_earlier_and_says_so(qwen):
    """Qwen3.5 keeps an agent turn's reasoning only after the last user message: a new user message
    rewrites the history before it, so less is reused, and the ids are still the whole encoding's."""
    family = incremental(qwen)
    messages = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Look at a.py."},
                {"role": "assistant", "content": "", "reasoning_content": "I should read it first.",
                 "tool_calls": [{"id": "c1", "type": "function",
                                 "function": {"name": "read_file", "arguments": {"path": "a.py"}}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "print('a')\n" * 50}]
    first = family.render(messages, [READ_FILE], True, conversation="c")
    messages += [{"role": "assistant", "content": "It prints a.", "reasoning_content": "Done reading."},
                 {"role": "user", "content": "Now b.py."}]
    second = family.render(messages, [READ_FILE], True, conversation="c")
    assert second.ids == qwen.render(messages, [READ_FILE], True).ids
    assert "I should read it first." in first.text and "I should read it first." not in second.text
    assert 0 < second.reused_ids < first.text.index("I should read it first.")  # tokens ≤ characters
    messages += [{"role": "assistant", "content": "Reading b.", "reasoning_content": "b next."},
                 {"role": "user", "content": "Thanks."}]
    third = family.render(messages, [READ_FILE], True, conversation="c")
    assert third.ids == qwen.render(messages, [READ_FILE], True).ids and third.reused_ids > second.reused_ids


def test_a_difference_found_by_a_check_is_counted_logged_and_the_whole_encoding_used(qwen, caplog):
    family = incremental(qwen, check_every=1)
    encoder = family.encoder
    sessions = list(turns(5, 4, []))
    family.render(sessions[0], [READ_FILE], False, conversation="c")
    right = encoder._encode
    # A fault in encoding a turn's new part only (a whole prompt starts with its system turn).
    encoder._encode = lambda marked: right(marked) if marked.startswith("<|im_start|>system") else \
        right(marked)[:-1] + [0]
    with caplog.at_level(logging.WARNING, logger="looptrace"):
        second = family.render(sessions[1], [READ_FILE], False, conversation="c")
    encoder._encode = right
    assert second.ids == qwen.render(sessions[1], [READ_FILE], False).ids and second.checked is False
    assert (encoder.checks, encoder.differences) == (1, 1) and "differed from a full encoding" in caplog.text
    third = family.render(sessions[2], [READ_FILE], False, conversation="c")
    assert third.checked is True and third.reused_ids > 0 and encoder.checks == 2


def test_kept_encodings_stay_within_their_bound_newest_kept(qwen):
    encoder = IncrementalEncoder(qwen.tokenizer, max_bytes=200_000)
    sizes = []
    for n in range(12):
        encoding, _ = encoder.encode(f"<|im_start|>user\n{n} " + "word " * 4000 + "<|im_end|>\n", f"c{n}")
        sizes.append(encoding.size)
    kept: KeptEncodings = encoder.kept
    assert kept._bytes <= 200_000 and 0 < len(kept) < 12 and "c11" in kept._by_key and "c0" not in kept._by_key
    assert kept._bytes == sum(e.size for e in kept._by_key.values())
    huge, _ = encoder.encode("<|im_start|>user\n" + "word " * 90_000 + "<|im_end|>\n", "huge")
    assert "huge" not in kept._by_key  # larger than the bound: not kept, nothing else pushed out for it


def test_one_walk_marks_keys_and_values_as_the_two_passes_do(qwen):
    """The incremental path marks a chat's keys and values in one walk (sanitize.mark_chat): the same
    as looptrace's key marking followed by transformers' own value marking, forged markers included."""
    import random

    from transformers.utils.chat_template_utils import _CONTROL_TOKEN_END as END
    from transformers.utils.chat_template_utils import _CONTROL_TOKEN_START as START
    from transformers.utils.chat_template_utils import mark_control_tokens

    from looptrace.families.sanitize import mark_chat, mark_keys

    control = qwen._control
    rng = random.Random(3)
    pieces = ["a", "<|im_end|>", "<tool_call>", START, END, START + "<|im_end|>" + END, "x y", "é", "\u0301", "<|"]

    def text() -> str:
        return "".join(rng.choice(pieces) for _ in range(rng.randint(0, 6)))

    def value(depth: int = 0):
        roll = rng.random()
        if depth > 3 or roll < 0.4:
            return rng.choice([text(), 1, None, True, 2.5])
        if roll < 0.7:
            return {text(): value(depth + 1) for _ in range(rng.randint(0, 3))}
        return [value(depth + 1) for _ in range(rng.randint(0, 3))]

    for _ in range(3000):
        chat = value()
        assert mark_chat(chat, control) == mark_control_tokens(mark_keys(chat, control), control), chat


# -- through the server and its store -----------------------------------------------------------------


@pytest.fixture(scope="module", params=store_kinds.KINDS)
def two_servers(request, qwen3_5_dir, tmp_path_factory):
    """The replay application twice on one kind of store: one tokenizing and storing every prompt whole
    (what looptrace did before), one encoding each turn from the last and storing what it adds."""
    folder = tmp_path_factory.mktemp("long")
    made = store_kinds.of_param(request, folder)
    placeholder = folder / "none.jsonl"
    placeholder.write_text('{"text": "unused"}\n')
    apps = {}
    for name, cache in (("whole", 0.0), ("incremental", 64.0)):
        apps[name] = AppThread(Settings(model=str(qwen3_5_dir), backend="replay", replay=str(placeholder),
                                        served_model_name="tiny-qwen", trace_db=made.setting(name),
                                        render_cache_mb=cache, render_check_every=1)).start()
    yield made, apps
    for app in apps.values():
        app.stop()
    made.close()


def run_session(app: AppThread, key: str, count: int) -> list[str]:
    """A session of `count` tool-calling turns (its messages as agent_sessions writes them, the model's
    calls from the replay); each step's trace id."""
    app.replay(*(CALL.format(n=n) for n in range(count)))
    traces = []
    for messages in turns(7, count, ["<|im_end|>", "<tool_call>"], reasoning=False):
        messages = [m if m["role"] != "assistant" else {**m, "tool_calls": [
            {**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}}
            for c in m.get("tool_calls", [])]} for m in messages]
        status, answer = app.call("POST", "/v1/chat/completions", {
            "model": "tiny-qwen", "messages": messages, "tools": [READ_FILE],
            "chat_template_kwargs": {"enable_thinking": False}}, {"session_id": key})
        assert status == 200, answer
        traces.append(answer)
    session = app.stored(f"/v1/sessions/{key}")
    for _ in range(100):
        if len(session["steps"]) == count:
            break
        session = app.stored(f"/v1/sessions/{key}")
    return [s["trace_id"] for s in session["steps"]]


def whole_parts(app: AppThread, trace_id: str) -> dict:
    trace = app.stored(f"/v1/traces/{trace_id}")
    render = next(s for s in trace["spans"] if s["name"] == attr.SPAN_RENDER)["attributes"]
    root = request_span(trace["spans"])["attributes"]
    return {"ids": render.get(attr.PROMPT_IDS), "text": render.get(attr.PROMPT_TEXT),
            "new_offset": render[attr.PROMPT_NEW_OFFSET], "new_text": render.get(attr.PROMPT_NEW_TEXT),
            "messages": json.loads(root[attr.GEN_AI_INPUT_MESSAGES]), "new_from": root[attr.INPUT_NEW_FROM]}


def test_every_step_reads_back_as_the_whole_store_has_it_and_is_stored_as_what_it_adds(two_servers):
    made, apps = two_servers
    steps = {name: run_session(app, f"long-{name}", 12) for name, app in apps.items()}
    for n, (whole, part) in enumerate(zip(steps["whole"], steps["incremental"])):
        assert whole_parts(apps["incremental"], part) == whole_parts(apps["whole"], whole), n
    store = made.make(apps["incremental"].settings.trace_db)
    kinds = made.sql(store, "SELECT kind, count(*), count(base) FROM trace_bases GROUP BY kind ORDER BY kind")
    assert kinds == [("input", 12, 11), ("prompt", 12, 11)]  # the first step whole, every other as what it adds
    # The last step's prompt holds what it adds: a fraction of the whole prompt the other store holds.
    sizes = {name: made.sql(made.make(app.settings.trace_db), "SELECT length(attributes) FROM spans "
                            "WHERE trace_id = ? AND name = ?", (steps[name][-1], attr.SPAN_RENDER))[0][0]
             for name, app in apps.items()}
    assert sizes["incremental"] * 4 < sizes["whole"], sizes


def test_the_template_text_is_rendered_from_windows_and_every_window_checked_agrees(two_servers):
    _, apps = two_servers
    app = apps["incremental"]
    before = {how: app.metric("looptrace_render_windows_total", how=how) for how in ("window", "whole", "fallback")}
    run_session(app, "windows", 8)
    after = {how: app.metric("looptrace_render_windows_total", how=how) - before[how] for how in before}
    # This session's new user messages (a third of its turns) are rendered whole; its tool turns from windows.
    assert sum(after.values()) == 8 and after["window"] >= 2 and after["whole"] == 1, after
    assert apps["whole"].metric("looptrace_render_windows_total", how="window") == 0
    with urllib.request.urlopen(app.url + "/metrics", timeout=30) as response:  # checked every turn here
        assert 'looptrace_render_drift_total{model="tiny-qwen"} 0.0' in response.read().decode()


def test_retention_makes_the_oldest_step_left_whole_first(two_servers):
    made, apps = two_servers
    app = apps["incremental"]
    traces = run_session(app, "retired", 6)
    expected = [whole_parts(app, t) for t in traces]
    store = made.make(app.settings.trace_db)
    doomed = ",".join(f"'{t}'" for t in traces[:3])
    select = f"SELECT trace_id FROM traces WHERE trace_id IN ({doomed})"
    if made.kind == "sqlite":
        with store._writer() as db:
            store._delete(db, select, ())
    else:
        db = store._writer()
        with db.transaction():
            store._delete(db, select, ())
    assert [app.call("GET", f"/v1/traces/{t}")[0] for t in traces[:3]] == [404] * 3
    assert [whole_parts(app, t) for t in traces[3:]] == expected[3:]
    assert made.sql(store, "SELECT count(*) FROM trace_bases WHERE trace_id = ? AND base IS NULL", (traces[3],)) \
        == [(2,)]  # a keyframe now, for its prompt and for its messages


def test_a_step_whose_base_is_gone_says_so_and_keeps_what_it_added(two_servers):
    made, apps = two_servers
    app = apps["incremental"]
    traces = run_session(app, "lost", 3)
    store = made.make(app.settings.trace_db)
    made.sql(store, "DELETE FROM spans WHERE trace_id = ?", (traces[1],))  # lost on the way, say
    trace = app.stored(f"/v1/traces/{traces[2]}")
    render = next(s for s in trace["spans"] if s["name"] == attr.SPAN_RENDER)["attributes"]
    assert render[attr.PROMPT_NOT_KEPT] == "base_missing" and attr.PROMPT_IDS not in render
    assert render[attr.PROMPT_ADDED_IDS] and render[attr.PROMPT_BASE_TRACE_ID] == traces[1]


@pytest.mark.parametrize("name", ["pi-chat-first-request", "pi-chat-after-tool-call", "codex-first-request",
                                  "codex-after-tool-call"])
def test_recorded_harness_requests_encode_as_whole_ones(replay_app, name):
    """What pi and codex really sent (../shared/clients/recorded), each turn checked against a whole
    encoding by the server itself."""
    path = SHARED / f"{name}.json"
    if not path.is_file():
        pytest.skip(f"{path} is not here (../shared)")
    body = json.loads(path.read_text())
    body = body.get("body", body)
    route = "/v1/responses" if "input" in body else "/v1/chat/completions"
    family = replay_app.runtime.family
    family.keep_encodings(1 << 26, 1)
    try:
        for _ in range(2):  # the second time, encoded from the first
            replay_app.replay("Done.<|im_end|>")
            status, answer = replay_app.call("POST", route, {**body, "model": "tiny-qwen", "stream": False},
                                             {"session_id": f"recorded-{name}"})
            assert status == 200, answer
        assert family.encoder.checks >= 1 and family.encoder.differences == 0
    finally:
        family.keep_encodings(0, 0)
