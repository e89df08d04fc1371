"""Two looptrace processes on one PostgreSQL store, a vLLM test double behind them: any process serves
any turn of a conversation, and the viewer of either shows every session whole, with what each step
added and its prompt diff. One process killed mid-answer; PostgreSQL stopped for 10 s mid-run and
started again: no 5xx, and nothing lost but what is counted and marked."""

from __future__ import annotations

import json
import secrets
import threading
import time

import pytest

import postgres
from server import free_port
from shared_store import Client, metric
from stores import Stores
from vllm_double import DoubleProcess
from waiting import wait_until

MODEL = "m"


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    return tmp_path_factory.mktemp("shared-logs")


@pytest.fixture(scope="module")
def store_url(logs):
    made = Stores("postgresql", logs, postgres.url())  # the cluster started here if stopped
    yield made.setting()
    made.close()


@pytest.fixture(scope="module")
def double(qwen3_5_dir, logs):
    started = DoubleProcess(qwen3_5_dir, port=free_port(), log_path=logs / "double.log", fast=True,
                            served_model_name=MODEL)
    try:
        started.wait_ready()
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def start(serve, double, store_url):
    def started():
        return Client(serve("--backend", "vllm", "--vllm-url", double.url, "--trace-db", store_url, "--vllm-timeout",
                            "20"))
    return started


@pytest.fixture(scope="module")
def pair(start):
    return start(), start()  # the first creates the store's tables; the second finds them


def test_a_chat_conversation_alternating_between_processes_reads_whole_on_either(pair):
    conversation = "chat-" + secrets.token_hex(4)
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Count to three."}]
    trace_ids = []
    for turn in range(4):
        status, answer, trace_id = pair[turn % 2].chat(conversation, messages, max_tokens=6)
        assert status == 200, answer
        trace_ids.append(trace_id)
        messages += [answer["choices"][0]["message"], {"role": "user", "content": f"And then {turn}?"}]
    for client in pair:  # the viewer's data, from either process
        session = wait_until(lambda: client.session(conversation, steps=4))
        assert [s["trace_id"] for s in session["steps"]] == trace_ids
        assert [s["new_from"] for s in session["steps"]] == [0, 2, 4, 6]  # what was new, whichever served the turn
        assert [len(s["new_messages"]) for s in session["steps"]] == [2, 2, 2, 2]
        for before, after in zip(trace_ids, trace_ids[1:]):
            status, view = client.get(f"/v1/traces/{after}/prompt?against={before}")
            assert status == 200 and view["against"] == before and view["diff"], view
            assert 0 < view["new_offset"] < view["count"]  # the prompt's new part, found on the other process
    views = [pair[i].get(f"/v1/traces/{trace_ids[2]}/prompt?against={trace_ids[1]}")[1] for i in (0, 1)]
    assert views[0] == views[1]


def test_a_responses_conversation_continues_by_previous_response_id_on_either(pair):
    conversation = "codex-" + secrets.token_hex(4)
    a, b = pair
    ids, trace_ids = [], []
    for turn, (client, text) in enumerate([(a, "List the files."), (b, "Open the first."), (a, "Now the second.")]):
        body = {"model": MODEL, "input": [{"type": "message", "role": "user", "content": text}], "max_output_tokens": 6}
        if ids:
            body["previous_response_id"] = ids[-1]
        status, answer, trace_id = client.respond(conversation, body)
        assert status == 200, answer
        ids.append(answer["id"])
        trace_ids.append(trace_id)
    status, found = a.get(f"/v1/responses/{ids[1]}")  # stored by the other process
    assert status == 200 and found["id"] == ids[1]
    assert b.request("DELETE", f"/v1/responses/{ids[0]}")[0] == 200
    status, error = a.get(f"/v1/responses/{ids[0]}")
    assert status == 404 and error["error"]["code"] == "response_not_found"
    for client in pair:
        steps = wait_until(lambda: client.session(conversation, steps=3))["steps"]
        assert [s["trace_id"] for s in steps] == trace_ids
        texts = [json.dumps(s["new_messages"]) for s in steps]
        assert "Open the first." in texts[1] and "List the files." not in texts[1]
        assert "Now the second." in texts[2] and "Open the first." not in texts[2]


def test_workers_on_one_port_share_the_store(serve, double, store_url):
    """`--workers 2` on the same store: the kernel spreads a client's connections over the workers, and
    whichever takes a turn finds the one before it."""
    client = Client(serve("--backend", "vllm", "--vllm-url", double.url, "--trace-db", store_url, "--workers", "2"))
    conversation = "workers-" + secrets.token_hex(4)
    messages = [{"role": "user", "content": "Hello."}]
    trace_ids = []
    for turn in range(6):  # each request a connection of its own (urllib): spread by SO_REUSEPORT
        status, answer, trace_id = client.chat(conversation, messages, max_tokens=4)
        assert status == 200, answer
        trace_ids.append(trace_id)
        messages += [answer["choices"][0]["message"], {"role": "user", "content": f"And {turn}?"}]
    session = wait_until(lambda: client.session(conversation, steps=6))
    assert [s["trace_id"] for s in session["steps"]] == trace_ids
    assert [s["new_from"] for s in session["steps"]] == [0, 1, 3, 5, 7, 9]


def test_a_process_killed_mid_answer_loses_only_that_answer(pair, start, double):
    conversation = "killed-" + secrets.token_hex(4)
    a, _ = pair
    doomed = start()
    messages = [{"role": "user", "content": "Tell me a story."}]
    status, answer, first = doomed.chat(conversation, messages, max_tokens=6)
    assert status == 200
    # Written before the kill: spans leave in batches, and a kill takes what is not yet written with it.
    wait_until(lambda: doomed.stored(first))
    messages.append(answer["choices"][0]["message"])
    double.arm(kind="delay", seconds=0.05)  # the next answer streams for seconds
    streaming = threading.Thread(target=doomed.stream_quietly, args=(conversation, messages + [
        {"role": "user", "content": "A long one."}]), daemon=True)
    streaming.start()
    wait_until(lambda: doomed.running() > 0 or None)
    doomed.server.process.kill()  # mid-answer: its spans and that turn's state never leave it
    doomed.server.process.wait()
    streaming.join(30)
    messages.append({"role": "user", "content": "Go on."})
    status, answer, third = a.chat(conversation, messages, max_tokens=6)
    assert status == 200, answer
    restarted = start()
    messages += [answer["choices"][0]["message"], {"role": "user", "content": "The end?"}]
    status, _, fourth = restarted.chat(conversation, messages, max_tokens=6)
    assert status == 200
    session = wait_until(lambda: restarted.session(conversation, steps=3))
    assert [s["trace_id"] for s in session["steps"]] == [first, third, fourth]
    assert [s["new_from"] for s in session["steps"]] == [0, 1, 3]  # against the last turn that finished


def test_postgresql_stopped_for_ten_seconds_mid_run(pair):
    """Requests keep coming to both processes, alternating, through an outage of the store."""
    results: list[tuple[int, str, float]] = []  # (status, trace id, when it was answered)
    reads: list[tuple[float, int, dict]] = []
    stop = threading.Event()

    def drive():
        conversation, messages, turn = "outage-" + secrets.token_hex(4), [], 0
        while not stop.is_set():
            client = pair[turn % 2]
            messages.append({"role": "user", "content": f"step {turn}"})
            status, answer, trace_id = client.chat(conversation, messages, max_tokens=4)
            results.append((status, trace_id, time.monotonic()))
            if status == 200:
                messages.append(answer["choices"][0]["message"])
            turn += 1
            time.sleep(0.1)

    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    try:
        wait_until(lambda: len(results) >= 5, timeout=60)  # both processes serving, the store up
        postgres.stop()
        down = time.monotonic()
        for _ in range(10):  # the outage: at least ten seconds, read every second
            status, body = pair[0].get("/v1/traces?limit=5", timeout=30)
            reads.append((time.monotonic() - down, status, body))
            time.sleep(1)
        # A response stored by this process before the outage still continues during it.
        status, first, _ = pair[1].respond("outage-r", {"model": MODEL, "input": "hi", "max_output_tokens": 4})
    finally:
        postgres.start()
        up = time.monotonic()
    assert status == 200, first
    wait_until(lambda: sum(when > up for _, _, when in results) >= 10, timeout=60)  # and on after it
    stop.set()
    driver.join(60)
    statuses = [s for s, _, _ in results]
    assert statuses and all(s == 200 for s in statuses), statuses  # never a 5xx, never a hang
    during = [when for _, _, when in results if down < when < up]
    assert len(during) >= 5, during  # served while the store was down
    refused = [(t, s, b) for t, s, b in reads if s != 200]
    assert refused and all(s == 503 and b["error"]["code"] == "trace_store_unreadable" for _, s, b in refused), reads
    # Caught up: every request's trace is whole, or marked as having lost spans, and those are counted.
    dropped = sum(metric(c.metrics(), "looptrace_trace_spans_dropped_total", 'sink="postgresql"') for c in pair)
    traces = {trace_id: wait_until(lambda: pair[0].stored(trace_id), timeout=120) for _, trace_id, _ in results}
    incomplete = [t for t, found in traces.items() if not found["complete"]]
    assert all(traces[t].get("lost_spans") for t in incomplete)
    assert len(incomplete) <= dropped, (incomplete, dropped)
    print(f"{len(results)} requests through a 10 s outage: {len(incomplete)} incomplete traces, {dropped:.0f} spans "
          f"dropped; reads during it: {[(round(t, 1), s) for t, s, _ in reads]}")


def test_reads_answer_again_once_the_store_is_back(pair):
    for client in pair:
        assert wait_until(lambda: client.get("/v1/sessions?limit=1")[0] == 200 or None, timeout=30)

