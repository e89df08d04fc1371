"""Several vLLM servers behind one looptrace (backends/vllm/pool.py), for real: three vLLM test doubles
(tests/support/vllm_double.py, --fast) behind one `looptrace serve`. Where each request went is read from
the doubles' own request logs and from the stored traces (the decode span's server.port), and the counts
from a real Prometheus scraping the real /metrics, with the dashboard's own queries: each conversation
on one server, a server that stops loses only its own conversations, which come back when it returns;
failures before the first token retried elsewhere, after it reported. The pool's choice itself is
tested directly in tests/unit/test_vllm_pool.py.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from grafana_dashboards import DASHBOARDS, VARIABLES, promql_targets, substitute
from server import free_port, sse_events
from vllm_double import DoubleProcess
from waiting import wait_until

MODEL = "pooled"
CONVERSATIONS = [f"agent-session-{i}" for i in range(12)]


# ---------------------------------------------------------------------------------------------
# Three doubles behind one looptrace
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    return tmp_path_factory.mktemp("pool-logs")


@pytest.fixture(scope="module")
def doubles(qwen3_5_dir, logs):
    started = [DoubleProcess(qwen3_5_dir, port=free_port(), log_path=logs / f"double-{i}.log", fast=True,
                             served_model_name=MODEL) for i in range(3)]
    try:
        for double in started:
            double.wait_ready()
        yield started
    finally:
        for double in started:
            double.stop()


@pytest.fixture(scope="module")
def pooled(serve, doubles, logs):
    """looptrace in front of the three doubles, and a real Prometheus scraping it every second."""
    from prometheus import Prometheus

    urls = [a for double in doubles for a in ("--vllm-url", double.url)]
    server = serve("--backend", "vllm", *urls, "--vllm-timeout", "5")
    prometheus = Prometheus([f"127.0.0.1:{server.port}"], logs / "prometheus")
    try:
        prometheus.wait_ready()
        yield server, prometheus
    finally:
        prometheus.stop()


def rendezvous(conversation: str, doubles: list[DoubleProcess]) -> DoubleProcess:
    """Where a conversation belongs, worked out here from its definition (the highest hash wins)."""
    def weight(double):
        return hashlib.blake2b(f"{conversation}\0{double.url}".encode(), digest_size=8).digest()
    return max(doubles, key=weight)


def turn(server, conversation: str | None, text: str, *, stream: bool = False, max_tokens: int = 4):
    headers = {"session_id": conversation} if conversation else {}
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"{conversation}: {text}"}],
            "max_tokens": max_tokens, "stream": stream, "temperature": 0}
    if not stream:
        return server.post("/v1/chat/completions", body, headers=headers)
    import urllib.request
    request = urllib.request.Request(server.url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", **headers}, method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.status, sse_events(response.read())


def served(doubles: list[DoubleProcess]) -> dict[int, int]:
    """Generations each double served so far, by port (the load-time probe, an empty body, left out)."""
    return {d.port: sum(1 for r in d.requests() if r["body"] and r["outcome"] == "done") for d in doubles}


def decode_spans(server, conversation: str, requests: int) -> list[dict]:
    """The decode span of each stored request of the conversation, oldest first, once its `requests`
    are stored (the store writes a request's spans a moment after its answer)."""
    def listing():
        found = server.get(f"/v1/traces?conversation={conversation}&limit=100")[1]["data"]
        return found if len(found) >= requests and all(t["complete"] for t in found) else None
    spans = []
    for item in reversed(wait_until(listing, 15, what=f"{requests} requests of {conversation} stored")):
        trace = server.get(f"/v1/traces/{item['trace_id']}")[1]
        spans.append(next(s for s in trace["spans"] if s["name"] == "decode"))
    return spans


def metric(prometheus, expr: str) -> dict[tuple, float]:
    return {tuple(sorted(s["metric"].items())): float(s["value"][1]) for s in prometheus.query(expr)}


def test_sessions_stick_move_when_a_server_stops_and_return_when_it_rejoins(pooled, doubles, qwen3_5_dir):
    server, prometheus = pooled
    for d in doubles:
        d.reset()
    home = {c: rendezvous(c, doubles) for c in CONVERSATIONS}
    assert len(set(home.values())) >= 2

    # Three turns of every conversation, interleaved as agents' turns are.
    for round_ in range(3):
        for c in CONVERSATIONS:
            status, body = turn(server, c, f"turn {round_}", stream=round_ == 1)
            assert status == 200, body
    assert served(doubles) == {d.port: 3 * sum(1 for c in CONVERSATIONS if home[c] is d) for d in doubles}
    health = server.get("/health")[1]
    assert [u["serving"] for u in health["upstreams"]] == [True, True, True]

    # One server stops mid-run: its conversations move to where rendezvous sends them among the other
    # two, the rest stay, and no request fails (the first one sent to the stopped server is retried).
    gone = max(doubles, key=lambda d: sum(1 for c in CONVERSATIONS if home[c] is d))
    left = [d for d in doubles if d is not gone]
    gone.stop()
    moved = [c for c in CONVERSATIONS if home[c] is gone]
    for d in left:
        d.reset()
    for c in moved + [c for c in CONVERSATIONS if c not in moved]:  # the stopped server's first
        status, body = turn(server, c, "after the stop")
        assert status == 200, body
    expected = {c: (rendezvous(c, left) if c in moved else home[c]) for c in CONVERSATIONS}
    assert served(left) == {d.port: sum(1 for c in CONVERSATIONS if expected[c] is d) for d in left}
    health = server.get("/health")[1]
    by_port = {u["server"]: u for u in health["upstreams"]}
    assert by_port[f"127.0.0.1:{gone.port}"]["serving"] is False
    assert "connection refused" in by_port[f"127.0.0.1:{gone.port}"]["error"]
    assert health["status"] == "ready"

    # The traces say where each turn went, and the one retried says from where.
    for c in CONVERSATIONS:
        spans = decode_spans(server, c, 4)
        ports = [s["attributes"]["server.port"] for s in spans]
        assert ports == [home[c].port] * 3 + [expected[c].port], c
        assert {s["attributes"]["server.address"] for s in spans} == {"127.0.0.1"}
        if c in moved:
            assert spans[-1]["attributes"]["looptrace.upstream.moved_from"] == f"127.0.0.1:{gone.port}"
    retried = [s for c in moved for s in decode_spans(server, c, 4)
               if any(e["name"] == "looptrace.upstream.retry" for e in s.get("events", []))]
    # At most the first request after the stop found out (retried elsewhere); the pool's health probe may
    # find out first, and then none is (the retry itself: test_a_failure_before_the_first_token_is_retried...).
    assert len(retried) <= 1

    # Restarted on its port: its probes answer again, it rejoins, and its conversations come back.
    back = DoubleProcess(qwen3_5_dir, port=gone.port, log_path=gone.log_path.with_name("double-back.log"), fast=True,
                         served_model_name=MODEL)
    doubles[doubles.index(gone)] = back
    back.wait_ready()
    wait_until(lambda: all(u["serving"] for u in server.get("/health")[1]["upstreams"]), timeout=15)
    for c in CONVERSATIONS:
        status, body = turn(server, c, "after the return")
        assert status == 200, body
    assert served([back])[back.port] == len(moved)
    for c in CONVERSATIONS:
        assert decode_spans(server, c, 5)[-1]["attributes"]["server.port"] == home[c].port

    # Counted, as Prometheus scraped it, through the dashboard's own queries.
    name = f"127.0.0.1:{gone.port}"
    wait_until(lambda: metric(prometheus, f'sum(looptrace_upstream_sessions_moved_total{{server="{name}"}})')
                    .get((), 0) == len(moved), timeout=15)
    errors = metric(prometheus, f'looptrace_upstream_errors_total{{server="{name}"}}')
    # Counted per request that met the stopped server: the one retried, if the probe did not find out first.
    assert {dict(k)["code"] for k in errors} <= {"upstream_unreachable"} and sum(errors.values()) == len(retried)
    dashboard_queries_return_each_server(prometheus, [f"127.0.0.1:{d.port}" for d in doubles], errors=bool(retried))


def dashboard_queries_return_each_server(prometheus, servers: list[str], errors: bool = True) -> None:
    """The dashboard's per-server panels (the looptrace_upstream_ series, which the replayed server of
    test_dashboards cannot have) return a series for every server."""
    queries = [t for path in DASHBOARDS for t in promql_targets(json.loads(path.read_text()))
               if "looptrace_upstream_" in t["expr"]]
    assert len(queries) >= 5
    for query in queries:
        expr = query["expr"].replace(f'model="{VARIABLES["model"]}"', f'model="{MODEL}"')
        assert substitute(expr)
        def servers_in(expr=expr) -> set:
            found = {s["metric"].get("server") for s in prometheus.query(expr)}
            return found if set(servers) <= found or "code" in expr else set()

        found = wait_until(servers_in, 20, every=0.5, or_last=True) or \
            {s["metric"].get("server") for s in prometheus.query(expr)}
        if "errors" in expr:
            assert found or not errors, query  # only servers that failed have error series
        else:
            assert set(servers) <= found, (query["panel"], expr, found)


def test_requests_without_a_conversation_take_turns_on_idle_servers(pooled, doubles):
    server, _ = pooled
    wait_until(lambda: all(u["serving"] for u in server.get("/health")[1]["upstreams"]), timeout=15)
    for d in doubles:
        d.reset()
    for i in range(6):
        status, body = turn(server, None, f"question {i}")
        assert status == 200, body
    assert sorted(served(doubles).values()) == [2, 2, 2]


def test_a_stream_cut_after_its_first_token_fails_clearly_and_is_not_retried(pooled, doubles):
    server, _ = pooled
    conversation = CONVERSATIONS[0]
    wait_until(lambda: all(u["serving"] for u in server.get("/health")[1]["upstreams"]), timeout=15)
    home = rendezvous(conversation, doubles)
    for d in doubles:
        d.reset()
    home.arm(kind="cut", after=2)
    status, events = turn(server, conversation, "a long answer", stream=True, max_tokens=20)
    assert status == 200 and events[-1] == "[DONE]"
    message = events[-2]["error"]["message"]
    assert message.startswith(f"the vLLM server at {home.url} cut the stream after 2 tokens"), message
    deltas = [e["choices"][0]["delta"] for e in events[:-2] if e.get("choices")]
    assert "".join(d.get("content") or d.get("reasoning_content") or "" for d in deltas)  # tokens went out first
    assert sum(len(d.requests()) for d in doubles if d is not home) == 0  # no retry once tokens went out

    home.arm(kind="cut", after=2)
    status, body = turn(server, conversation, "a long answer", max_tokens=20)
    assert (status, body["error"]["code"]) == (502, "upstream_stream_cut")
    assert body["error"]["message"].startswith(f"the vLLM server at {home.url} cut the stream after 2 tokens")


def test_a_failure_before_the_first_token_is_retried_on_another_server(pooled, doubles):
    server, _ = pooled
    conversation = CONVERSATIONS[1]
    home = rendezvous(conversation, doubles)
    for d in doubles:
        d.reset()
    home.arm(kind="status", status=500, message="engine dead")
    before = server.newest_trace_id()
    status, body = turn(server, conversation, "hello")
    assert status == 200, body
    assert served([home])[home.port] == 0 and sum(served(doubles).values()) == 1
    span = next(s for s in server.trace_after(before)["spans"] if s["name"] == "decode")
    retry = next(e for e in span["events"] if e["name"] == "looptrace.upstream.retry")
    assert retry["attributes"]["error.type"] == "upstream_error"
    assert "engine dead" in retry["attributes"]["looptrace.upstream.error"]
    # A request the server refuses as the client's fault (a 4xx) is not tried elsewhere.
    home.arm(kind="status", status=400, message="bad prompt")
    status, body = turn(server, conversation, "hello again")
    assert (status, body["error"]["message"]) == (400, "bad prompt")
