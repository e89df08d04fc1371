"""`looptrace serve --workers 2` for real (proxy/workers.py): two worker processes on one port in front
of the vLLM test double (--fast), scraped every second by a real Prometheus. Its /metrics is the sum of
both workers, each series once, whichever worker answers; a worker killed mid-run is restarted (the
log says so) while the other answers, and its counts are neither lost nor doubled; SIGTERM lets a
request in flight finish, stops both, and the supervisor's exit code says it stopped cleanly.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import urllib.request

import pytest
from server_workers import all_ready, children, counted_by_pid, metrics_dir, ready_count, slot_of

from prometheus import Prometheus
from server import Server, free_port, sse_events
from vllm_double import DoubleProcess
from waiting import wait_until

MODEL = "fleet"
TOKENS = 12


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    return tmp_path_factory.mktemp("workers")


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
def fleet(double, logs):
    """`looptrace serve --workers 2` with both workers ready, and Prometheus scraping its port."""
    server = Server("--backend", "vllm", "--vllm-url", double.url, "--workers", "2", log_dir=logs)
    prometheus = Prometheus([f"127.0.0.1:{server.port}"], logs / "prometheus")
    try:
        server.wait_ready(300)
        server.wait_until(lambda: all_ready(server.log(), 2), 300)
        prometheus.wait_ready()
        prometheus.wait_scraped()
        yield server, prometheus
    finally:
        prometheus.stop()
        server.stop()


def ask(server: Server, *, stream: bool = True, max_tokens: int = TOKENS) -> tuple[int, list]:
    """One chat request on a connection of its own (so the kernel may give it to either worker)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me about the parser."}],
            "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    request = urllib.request.Request(server.url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=120) as response:
        return response.status, sse_events(response.read()) if stream else [json.loads(response.read())]


def value(prometheus: Prometheus, expr: str) -> float | None:
    result = prometheus.query(expr)
    assert len(result) <= 1, result  # one series: never one per worker
    return float(result[0]["value"][1]) if result else None


def settles_at(prometheus: Prometheus, expr: str, expected: float, timeout: float = 30) -> float | None:
    """The query's value once it is `expected`, or the last one read at the deadline."""
    if wait_until(lambda: value(prometheus, expr) == expected, timeout, every=0.5, or_last=True):
        return expected
    return value(prometheus, expr)


def workers_of(server: Server) -> dict[int, int]:
    return {slot_of(pid): pid for pid in children(server.process.pid)}


REQUESTS = f'looptrace_requests_total{{model="{MODEL}",endpoint="chat",status="200"}}'


def test_every_series_is_the_sum_of_both_workers_once(fleet):
    server, prometheus = fleet
    before = value(prometheus, REQUESTS) or 0.0
    sent = 30
    for _ in range(sent):
        status, events = ask(server)
        assert status == 200 and events[-1] == "[DONE]"
    total = before + sent
    assert settles_at(prometheus, REQUESTS, total) == total

    # What each worker counted in its own file: both served some, and the scrape is their sum.
    pids = workers_of(server)
    assert sorted(pids) == [0, 1]
    by_pid = counted_by_pid(metrics_dir(pids[0]), "looptrace_requests_total", model=MODEL, status="200")
    assert set(pids.values()) <= set(by_pid) and all(by_pid[p] > 0 for p in pids.values()), by_pid
    assert sum(by_pid.values()) == total

    # Counters and histograms summed once, gauges by their mode, one series each (value() checks).
    tokens = f'sum(looptrace_generation_tokens_total{{model="{MODEL}"}})'
    assert value(prometheus, tokens) == total * TOKENS
    ttft = f'looptrace_time_to_first_token_seconds_count{{model="{MODEL}",endpoint="chat"}}'
    assert value(prometheus, ttft) == total
    inf = f'looptrace_time_to_first_token_seconds_bucket{{model="{MODEL}",endpoint="chat",le="+Inf"}}'
    assert value(prometheus, inf) == total
    upstream = f'looptrace_upstream_requests_total{{model="{MODEL}"}}'
    assert value(prometheus, upstream) == total
    # A gauge read by a function is copied into each worker's file once a second (metrics.py), and the
    # worker that answers a scrape copies only its own: the other's last request may still read as
    # running for up to a second after it ended (seen beside two busy loops: 1, then 0 a second later
    # with no request between). So the gauge is waited for, not read once.
    running = f'looptrace_requests_running{{model="{MODEL}"}}'
    assert settles_at(prometheus, running, 0, timeout=10) == 0
    assert value(prometheus, f'looptrace_upstream_up{{model="{MODEL}"}}') == 1
    assert value(prometheus, 'looptrace_trace_spans_dropped_total{sink="sqlite"}') == 0
    # The same as a single process names it: no worker label, no per-process series.
    series = prometheus.query(f'{{__name__=~"looptrace_.*",model="{MODEL}"}}')
    assert series and not any("pid" in s["metric"] for s in series)


def test_running_requests_are_summed_over_the_workers(fleet, double):
    server, prometheus = fleet
    double.arm(kind="delay", seconds=0.25)  # the next generation only: one slow stream
    done: list = []
    slow = threading.Thread(target=lambda: done.append(ask(server, max_tokens=40)))
    slow.start()
    try:
        got = settles_at(prometheus, f'looptrace_requests_running{{model="{MODEL}"}}', 1, timeout=20)
        assert got == 1
    finally:
        slow.join(60)
    assert done and done[0][0] == 200


def test_exemplars_survive_and_lead_to_stored_traces(fleet):
    server, prometheus = fleet
    for _ in range(4):
        ask(server)
    found = wait_until(lambda: prometheus.exemplars(f'looptrace_time_to_first_token_seconds_bucket{{model="{MODEL}"}}'),
                       30, every=0.5)
    trace_ids = {e["labels"]["trace_id"] for series in found for e in series["exemplars"]}
    assert trace_ids
    for trace_id in trace_ids:  # whichever worker wrote it, the store both share has it
        status, body = server.get(f"/v1/traces/{trace_id}")
        assert status == 200, (trace_id, body)


def test_a_killed_worker_is_restarted_and_its_counts_are_kept(fleet):
    server, prometheus = fleet
    for _ in range(10):
        assert ask(server)[0] == 200
    pids = workers_of(server)
    folder = metrics_dir(pids[1])
    counted = sum(counted_by_pid(folder, "looptrace_requests_total", model=MODEL, status="200").values())
    settled = settles_at(prometheus, REQUESTS, counted)
    assert settled == counted
    readies = ready_count(server.log(), 1)

    os.kill(pids[1], signal.SIGKILL)
    # Until it is gone: a connection the kernel queued on its listening socket in its last moment is
    # reset, as with any server whose workers share a port (Linux ≥ 5.14 can hand such connections to
    # another worker instead: net.ipv4.tcp_migrate_req = 1). Gone means reaped, not a zombie: a killed
    # process's main thread shows as a zombie while its other threads still exit, holding the socket
    # open (a request sent then was reset, about one run in five).
    server.wait_until(lambda: not os.path.exists(f"/proc/{pids[1]}"), 10)
    answered = 0

    def answered_until_restarted() -> bool:
        """One more request answered; enough once 20 are and the new worker is ready."""
        nonlocal answered
        try:
            status, events = ask(server)  # the other worker answers; the new one once it has loaded
        except OSError as exc:  # a reset, say: what the supervisor and workers logged around it
            raise AssertionError(f"request {answered} after the kill failed: {exc!r}\n{server.log()[-6000:]}") from exc
        assert status == 200 and events[-1] == "[DONE]"
        answered += 1
        return answered >= 20 and ready_count(server.log(), 1) > readies

    wait_until(answered_until_restarted, 120, every=0, or_last=True)  # past it, the checks below say what is missing
    log = server.log()
    assert f"worker 1 (pid {pids[1]}) was killed by SIGKILL" in log and "restarting it" in log
    assert ready_count(log, 1) == readies + 1, log[-3000:]
    after = workers_of(server)
    assert after[0] == pids[0] and after[1] != pids[1]

    # Its requests still count (its file stays), the new worker's are added, nothing twice.
    assert settles_at(prometheus, REQUESTS, settled + answered) == settled + answered
    assert value(prometheus, f"resets({REQUESTS}[10m])") == 0
    by_pid = counted_by_pid(folder, "looptrace_requests_total", model=MODEL, status="200")
    assert pids[1] in by_pid and sum(by_pid.values()) == settled + answered


def test_sigterm_drains_a_request_in_flight_and_exits_cleanly(double, logs):
    server = Server("--backend", "vllm", "--vllm-url", double.url, "--workers", "2", log_dir=logs)
    try:
        server.wait_ready(300)
        server.wait_until(lambda: all_ready(server.log(), 2), 300)
        pids = list(workers_of(server).values())
        folder = metrics_dir(pids[0])
        double.arm(kind="delay", seconds=0.1)
        done: list = []
        slow = threading.Thread(target=lambda: done.append(ask(server, max_tokens=30)))
        slow.start()
        server.wait_until(lambda: any(r["outcome"] == "streaming" for r in double.requests()) or bool(done), 60)
        server.process.send_signal(signal.SIGTERM)
        slow.join(60)
        code = server.process.wait(90)
    finally:
        server.stop()
    status, events = done[0]
    usage = [e["usage"] for e in events if isinstance(e, dict) and e.get("usage")]
    assert status == 200 and events[-1] == "[DONE]" and usage[-1]["completion_tokens"] == 30  # all of it
    assert code == 0, server.log()[-3000:]
    assert "stopping 2 workers" in server.log()
    wait_until(lambda: not any(os.path.exists(f"/proc/{pid}") for pid in pids), 10, what="the workers gone")
    assert not folder.exists()  # the metrics folder goes with the server


def test_a_model_in_the_process_refuses_workers(logs, qwen3_5_dir):
    server = Server(str(qwen3_5_dir), "--workers", "2", log_dir=logs)
    code = server.process.wait(60)
    server.stop()
    assert code == 2
    assert "--workers is for --backend vllm and replay" in server.log()
