"""Routing by what each vLLM server holds, for real processes: `looptrace serve --routing cache-aware` in
front of two vLLM test doubles (tests/support/vllm_double.py, --fast) publishing their KV events as vLLM
does (tests/support/kv_publisher.py; its messages checked against a real vLLM's in
test_real_vllm_routing.py). Every request's receipt (the decode span's looptrace.route.*) is read back
from the store: its prediction of cached tokens is exactly what the double then reports, through what a
real server will not do on demand (a seq gap, a publisher that goes silent, one that restarts, a cache
reset, a server that leaves and comes back), and with --workers 2, each worker following the events."""

from __future__ import annotations

import json
import time

import pytest

from server import free_port
from vllm_double import DoubleProcess
from waiting import wait_until

MODEL = "routed"


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    return tmp_path_factory.mktemp("routing")


def start_double(qwen3_5_dir, logs, name: str, port: int | None = None) -> DoubleProcess:
    folder = logs / f"kv-{name}"
    folder.mkdir(exist_ok=True)
    events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"ipc://{folder}/events",
              "replay_endpoint": f"ipc://{folder}/replay", "topic": "kv-events"}
    double = DoubleProcess(qwen3_5_dir, port=port or free_port(), log_path=logs / f"double-{name}-{time.time()}.log",
                           fast=True, served_model_name=MODEL, kv_events=events, blocks=400)
    double.wait_ready()
    return double


@pytest.fixture(scope="module")
def doubles(qwen3_5_dir, logs):
    started = [start_double(qwen3_5_dir, logs, name) for name in ("a", "b")]
    yield started
    for double in started:
        double.stop()


def routed_args(doubles) -> list[str]:
    return ["--backend", "vllm", "--routing", "cache-aware", "--vllm-timeout", "5",
            *[a for d in doubles for a in ("--vllm-url", d.url, "--vllm-kv-events", d.kv_events_spec)]]


@pytest.fixture(scope="module")
def routed(serve, doubles):
    server = serve(*routed_args(doubles))
    wait_until(lambda: all(u["kv_events"]["state"] == "following" for u in server.get("/health")[1]["upstreams"]),
               20, every=0.2, what="every upstream following its KV events")
    return server


class Conversation:
    """An agent's session: each turn the whole conversation again, grown by the model's answer."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.messages = [{"role": "system", "content": "You are a coding agent. " * 20},
                         {"role": "user", "content": f"{name}: read the parser and find the bug."}]

    def turn(self, server, text: str = "go on", stream: bool = False) -> dict:
        body = {"model": MODEL, "messages": self.messages, "max_tokens": 40, "temperature": 0, "stream": stream}
        status, answer = server.post("/v1/chat/completions", body, headers={"session_id": self.name})
        assert status == 200, answer
        if not stream:
            self.messages = [*self.messages, {"role": "assistant", "content": answer["choices"][0]["message"]
                             ["content"] or "ok"}, {"role": "user", "content": f"{text} ({len(self.messages)})"}]
        return answer


def receipts(server, conversation: str, count: int | None = None) -> list[dict]:
    """The decode span's attributes of each stored request of the conversation, oldest first (its `count`
    requests: the store writes in batches, a moment after each request)."""
    def listing():
        return server.get(f"/v1/traces?conversation={conversation}&limit=200")[1]["data"]
    wait_until(lambda: len(listing()) >= (count or 1), 20, every=0.2, what=f"{count or 1} requests stored")
    spans = []
    for item in reversed(listing()):
        trace = server.get(f"/v1/traces/{item['trace_id']}")[1]
        spans.append(next(s for s in trace["spans"] if s["name"] == "decode")["attributes"])
    return spans


def exact(receipt: dict) -> bool:
    return receipt["looptrace.route.prediction_error"] == 0 and \
        receipt["looptrace.route.cached_tokens"] == receipt["looptrace.route.predicted_cached_tokens"]


def brief(receipt: dict) -> tuple:
    """A receipt in a few words, for a failure's message."""
    return tuple(receipt.get(f"looptrace.route.{k}") for k in ("predicted_cached_tokens", "cached_tokens", "index",
                                                                "reason", "runner_up",
                                                                "runner_up_predicted_cached_tokens")) + \
        (receipt["server.port"],)


def upstream(server, double) -> dict:
    return next(u for u in server.get("/health")[1]["upstreams"] if u["server"] == f"127.0.0.1:{double.port}")


def test_every_receipt_predicts_what_the_server_then_reports(routed, doubles):
    conversations = [Conversation(f"agent-{i}") for i in range(4)]
    for round_ in range(4):
        for c in conversations:
            c.turn(routed)
    hits = 0
    for c in conversations:
        spans = receipts(routed, c.name, 4)
        assert len(spans) == 4
        for n, span in enumerate(spans):
            assert exact(span), (c.name, n, span)
            assert span["looptrace.route.index"] == "events" and span["looptrace.route.policy"] == "cache-aware"
            assert span["looptrace.route.runner_up"] in {f"127.0.0.1:{d.port}" for d in doubles}
            hits += span["looptrace.route.cached_tokens"] > 0
            # The price the choice was made at, and the wait it then took (rounded to the microsecond each).
            assert span["looptrace.route.expected_ttft"] > 0 and span["looptrace.route.prefill_tokens"] >= 1
            assert span["looptrace.route.ttft_error"] == pytest.approx(
                span["looptrace.route.ttft"] - span["looptrace.route.expected_ttft"], abs=2e-6)
            assert span["looptrace.route.score"] == span["looptrace.route.expected_ttft"]
            assert span["looptrace.route.runner_up_expected_ttft"] == span["looptrace.route.runner_up_score"]
        # Later turns stay where their earlier turns are held.
        assert len({s["server.port"] for s in spans}) == 1
        assert {s["looptrace.route.reason"] for s in spans[1:]} == {"home"}
    assert hits >= 12  # every conversation's later turns hit
    # The step in the viewer carries the receipt.
    session = routed.get(f"/v1/sessions/{conversations[0].name}")[1]
    route = session["steps"][-1]["route"]
    assert route["cached"] == route["predicted"] > 0 and route["server"].startswith("127.0.0.1:")
    assert route["policy"] == "cache-aware" and route["index"] == "events"
    assert route["ttft"] > 0 and route["expected_ttft"] > 0 and route["prefill_rate"] > 0
    # Counted per server: what each found, and what was predicted.
    answered = 0
    for double in doubles:
        name = f"127.0.0.1:{double.port}"
        assert routed.metric("looptrace_upstream_cached_tokens_total", server=name) == \
            routed.metric("looptrace_upstream_predicted_cached_tokens_total", server=name)
        assert routed.metric("looptrace_upstream_kv_events_trusted", server=name) == 1
        # Each answered request taught the server's price, and was measured against it. (Not every server need
        # have answered one: the doubles answer in milliseconds, and a slow answer on a busy machine fits a rate at
        # which the system prompt the conversations share saves more than NEAR_SECONDS: a new conversation then
        # rightly goes where it is held, and one of four conversations homed on the other double is all there is.)
        taught = upstream(routed, double)["cost"]["answered"]
        assert routed.metric("looptrace_upstream_ttft_prediction_error_seconds_count", server=name) == taught
        answered += taught
    assert answered >= 16


def test_a_gap_in_the_events_is_filled_and_a_reset_is_followed(routed, doubles):
    c = Conversation("gap")
    c.turn(routed)
    home = next(d for d in doubles if d.port == receipts(routed, "gap", 1)[0]["server.port"])
    home.kv_event_faults(drop=2)  # two batches never sent: the replay socket has them
    for _ in range(3):
        c.turn(routed)
    health = upstream(routed, home)["kv_events"]
    assert health["gaps"] >= 1 and health["replayed"] >= 2 and health["lost"] == 0
    home.reset_prefix_cache()  # vLLM's own reset: AllBlocksCleared, published with the next request's events
    c.turn(routed)
    c.turn(routed)
    spans = receipts(routed, "gap", 6)
    # The turn after the two lost batches is routed before anything says they were lost (the next batch,
    # its own, tells): it misses what they stored. From then on the replay has them.
    assert spans[2]["looptrace.route.predicted_cached_tokens"] < spans[2]["looptrace.route.cached_tokens"]
    # The turn after the reset is routed before the reset is published (vLLM's too): it expects what was.
    assert spans[4]["looptrace.route.cached_tokens"] == 0 < spans[4]["looptrace.route.predicted_cached_tokens"]
    assert all(exact(s) for n, s in enumerate(spans) if n not in (2, 4)), [brief(s) for s in spans]
    assert spans[-1]["looptrace.route.cached_tokens"] > 0


def test_a_restarted_publisher_is_read_again_from_nothing(routed, doubles):
    c = Conversation("restart")
    for _ in range(2):
        c.turn(routed)
    home = next(d for d in doubles if d.port == receipts(routed, "restart", 2)[0]["server.port"])
    restarts = upstream(routed, home)["kv_events"]["restarts"]
    home.kv_event_faults(restart=True)  # seq from 0 again, its cache empty: a restarted vLLM
    c.turn(routed)
    c.turn(routed)
    c.turn(routed)
    spans = receipts(routed, "restart", 5)
    # A restart this quick (no probe saw the server gone) shows in its first batch, which the turn after it
    # makes: that turn was predicted from what the server held before. Then the index starts over.
    assert spans[2]["looptrace.route.cached_tokens"] == 0 < spans[2]["looptrace.route.predicted_cached_tokens"]
    assert all(exact(s) for n, s in enumerate(spans) if n != 2), [brief(s) for s in spans]
    assert spans[3]["looptrace.route.cached_tokens"] > 0
    assert upstream(routed, home)["kv_events"]["restarts"] == restarts + 1


def test_a_silent_publisher_is_noticed_and_the_estimate_used(routed, doubles):
    c = Conversation("silent")
    c.turn(routed)
    home = next(d for d in doubles if d.port == receipts(routed, "silent", 1)[0]["server.port"])
    home.kv_event_faults(publish=False)  # the server serves on; its events stop
    c.turn(routed)
    wait_until(lambda: upstream(routed, home)["routing_index"] == "estimate", 15, every=0.2)
    assert upstream(routed, home)["kv_events"]["trusted"] is False
    assert routed.metric("looptrace_upstream_kv_events_trusted", server=f"127.0.0.1:{home.port}") == 0
    c.turn(routed)
    span = receipts(routed, "silent", 3)[-1]
    assert span["looptrace.route.index"] == "estimate", brief(span)
    assert span["looptrace.route.cached_tokens"] > 0  # what looptrace sent it, estimated, still found there
    home.kv_event_faults(publish=True)
    c.turn(routed)
    wait_until(lambda: upstream(routed, home)["routing_index"] == "events", 20, every=0.2)
    # What it stored and evicted while silent is unknown to its index: a reset puts the two in step again.
    home.reset()


def test_a_server_that_leaves_and_returns_is_read_again(routed, doubles, qwen3_5_dir, logs):
    conversations = [Conversation(f"leave-{i}") for i in range(4)]
    for c in conversations:
        c.turn(routed)
    gone = doubles[1]
    gone.stop()
    for c in conversations:
        c.turn(routed)  # all on the other server now (one retried after the stop was found)
    wait_until(lambda: upstream(routed, gone)["serving"] is False, 20, every=0.2)
    back = start_double(qwen3_5_dir, logs, "b", port=gone.port)  # its sockets again; a new, empty cache
    doubles[1] = back
    wait_until(lambda: upstream(routed, back)["serving"] and upstream(routed, back)["kv_events"]["blocks"] == 0, 20,
               every=0.2)
    for c in conversations:
        c.turn(routed)
        c.turn(routed)
    for c in conversations:
        spans = receipts(routed, c.name, 4)
        assert all(exact(s) for s in spans if s.get("looptrace.route.reason") != "retry"), [brief(s) for s in spans]
        assert spans[1]["server.port"] == doubles[0].port


def test_each_worker_follows_the_events(serve, doubles, logs):
    from server_workers import all_ready

    for double in doubles:
        double.reset()  # an empty cache, said in its events: the workers read the same from the start
    server = serve(*routed_args(doubles), "--workers", "2", wait=False)
    server.wait_ready(300)
    server.wait_until(lambda: all_ready(server.log(), 2), 300)
    conversations = [Conversation(f"workers-{i}") for i in range(3)]
    for _ in range(3):
        for c in conversations:
            c.turn(routed_server := server)
    spans = [s for c in conversations for s in receipts(routed_server, c.name, 3)]
    assert len(spans) == 9 and all(exact(s) and s["looptrace.route.index"] == "events" for s in spans), \
        [brief(s) for s in spans]
    assert sum(s["looptrace.route.cached_tokens"] for s in spans) > 0
    assert json.dumps(server.get("/health")[1]).count('"state": "following"') == 2
