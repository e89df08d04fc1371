"""Several vLLM servers behind one looptrace (backends/vllm/pool.py), the pool's choice driven directly:
each conversation on one server, a server that stops loses only its own conversations, which come back
when it returns; a failed server not chosen again for the same request. Three vLLM test doubles behind
a real `looptrace serve` are in tests/integration/test_vllm_pool_processes.py.
"""

from __future__ import annotations

from collections import Counter

import pytest

from looptrace.backends.base import BackendError
from looptrace.backends.vllm.backend import Pool, Upstream

# ---------------------------------------------------------------------------------------------
# The choice, without servers
# ---------------------------------------------------------------------------------------------


def pool_of(*urls: str) -> Pool:
    upstreams = [Upstream(url) for url in urls]
    for upstream in upstreams:
        upstream.connected = upstream.reachable = True
        upstream.model, upstream.root, upstream.max_model_len = "m", "org/m", 4096
    return Pool(upstreams)


def homes(pool: Pool, conversations) -> dict[str, str]:
    return {c: pool.choose(c).upstream.name for c in conversations}


def test_conversations_spread_and_stay():
    pool = pool_of("http://a:8000", "http://b:8000", "http://c:8000")
    many = [f"conversation {i}" for i in range(3000)]
    first = homes(pool, many)
    assert homes(pool, many) == first  # every turn on the same server
    shares = Counter(first.values())
    assert set(shares) == {"a:8000", "b:8000", "c:8000"}
    assert all(900 < n < 1100 for n in shares.values()), shares  # a third each, give or take


def test_losing_a_server_moves_only_its_conversations_and_its_return_brings_them_back():
    pool = pool_of("http://a:8000", "http://b:8000", "http://c:8000")
    many = [f"conversation {i}" for i in range(600)]
    before = homes(pool, many)
    b = pool.upstreams[1]
    b.unreachable("connection refused")
    during = {}
    for c in many:
        route = pool.choose(c)
        chosen, moved_from = route.upstream, route.moved_from
        during[c] = chosen.name
        # Moved exactly when its server was b, and said so.
        assert moved_from == ("b:8000" if before[c] == "b:8000" else None)
    assert {c for c in many if during[c] != before[c]} == {c for c in many if before[c] == "b:8000"}
    assert "b:8000" not in during.values()
    b.answered()
    after = {}
    for c in many:
        route = pool.choose(c)
        chosen, moved_from = route.upstream, route.moved_from
        after[c] = chosen.name
        assert moved_from == (during[c] if before[c] == "b:8000" else None)
    assert after == before


def test_a_request_without_a_conversation_goes_to_the_least_loaded_server():
    pool = pool_of("http://a:1", "http://b:2", "http://c:3")
    a, b, c = pool.upstreams
    a.running, b.running, c.running = 3, 1, 2
    route = pool.choose(None)
    assert (route.upstream, route.moved_from, route.reason) == (b, None, "least_loaded")
    b.running = 5
    assert pool.choose(None).upstream is c
    a.running = b.running = c.running = 0  # idle: they take turns
    assert sorted(pool.choose(None).upstream.name for _ in range(6)) == ["a:1", "a:1", "b:2", "b:2", "c:3", "c:3"]


def test_a_failed_server_is_not_chosen_again_for_the_same_request():
    pool = pool_of("http://a:1", "http://b:2")
    first = pool.choose("x").upstream
    second = pool.choose("x", failed=first)
    assert second.upstream is not first and second.moved_from == first.name and second.reason == "retry"
    alone = pool_of("http://a:1")
    with pytest.raises(BackendError) as caught:
        alone.choose("x", failed=alone.upstreams[0])
    assert caught.value.status == 503


def test_when_no_server_answers_its_probes_one_is_still_tried():
    # A probe may be seconds old: the request tries a server, and its failure is what the client hears.
    pool = pool_of("http://a:1", "http://b:2")
    for upstream in pool.upstreams:
        upstream.unreachable("connection refused")
    assert pool.choose("x").upstream in pool.upstreams
    assert not pool.serving


def test_a_server_of_another_model_is_kept_out():
    pool = pool_of("http://a:1")
    pool.reference = pool.upstreams[0]
    other = Upstream("http://b:2")
    other.model, other.root, other.max_model_len, other.connected, other.reachable = "m", "org/other", 4096, True, True
    pool.upstreams.append(other)
    with pytest.raises(RuntimeError, match="every --vllm-url must serve the same model"):
        pool._check(other)
    assert not other.serving and all(pool.choose(f"c{i}").upstream is pool.upstreams[0] for i in range(20))


def test_a_server_named_twice_is_refused_at_the_command_line(capsys):
    from looptrace.proxy.cli import main

    with pytest.raises(SystemExit):
        main(["serve", "--backend", "vllm", "--vllm-url", "http://gpu-a:8000/v1", "--vllm-url", "http://gpu-a:8000"])
    assert "a server is named twice" in capsys.readouterr().err
