"""Which vLLM server takes a request: the policies of --routing, in one table, and the receipt each choice
leaves (`Route`), which the decode span, the metrics and the trace viewer show.

    rendezvous    a conversation goes to its home: the server of the highest hash of (conversation, server
                  URL) among those that answer. No table, the same in every looptrace process; a server that
                  leaves moves only its own conversations. Blind to load and to what each server holds.
    least-loaded  the server with the fewest requests running and waiting; ties go to the home, so that
                  a conversation keeps its cache while the servers are evenly loaded.
    cache-aware   the server where the request's expected time to first token is least (cost.py: the prompt tokens
                  it would compute there after what that server holds of it, plus the uncached prompt tokens queued
                  there, over the server's measured prefill rate, plus its decode pressure). The conversation's home
                  keeps it unless another server saves more than NEAR of the home's expected time, at least
                  NEAR_SECONDS, and more than the two prices can be told apart by (each server's recent misses,
                  cost.py's spread). Its home is the server predicted to hold the most of its own prompt
                  (kv_index.py: beyond the prefix it shares with other conversations, a system prompt every server
                  soon holds); while none holds any, the server of its last request (conversations.py); for its
                  first request, its rendezvous server. Once one holds it, the home must also be crowded: the queue
                  the pool's recent requests found there at least CROWDED times the other's; while none does, a
                  conversation under way moves only where that evens the conversations the servers keep lately.
                  So a move happens only where reading the conversation again elsewhere costs less than the queue it
                  escapes, and only off a queue that lasts or a server keeping more: its later turns go with it, and
                  a wave of turns that each server drains in its turn is no reason to move them.

A request without a conversation goes to the least loaded server (idle ones take turns) by rendezvous and
least-loaded, to the least expected time to first token by cache-aware (idle ones take turns on ties).

A server's load is its requests running and waiting: vLLM's own count (its /metrics, read every
LOAD_SECONDS, which counts every looptrace process's requests) or this process's own (known at once),
whichever is larger. Every policy's receipt carries each server's price (cost.py), so that what cache-aware
would have expected is on the receipts of the others too.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from .cost import MET_LEAST

if TYPE_CHECKING:
    from collections.abc import Mapping

    from .cost import Price, ServerCost
    from .kv_index import Holdings, PromptBlocks
    from .load import Load

LOAD_SECONDS = 1.0  # between readings of each server's /metrics, for the policies that weigh load
NEAR = 0.1  # cache-aware: the share of the home's expected time another server must save to take the request
NEAR_SECONDS = 0.05  # and the least it must save
# cache-aware: a conversation leaves the home that holds its prompt only while the queue found there has lately been
# this many times the other server's. The SGLang model gateway leaves cache affinity while the busiest worker's load is
# 1.5 times the idlest's (its --balance-rel-threshold), counted now. Averaged over the last requests (cost.py's `met`),
# 1.5 still let waves of turns move conversations in bench/routing_sim.py's H200-scaled even workload (88 moves, 77.3 %
# hits against 79.5); 3 moved too few in its skewed one (the busiest server 1.13 × the mean, p99 0.69 s against 0.63).
CROWDED = 2.0


class Server(Protocol):
    """A vLLM server as the policies read it (the pool's Upstream, backends/vllm/upstream.py): named here, so that
    the routing imports nothing of the servers it ranks."""

    url: str
    name: str  # "host:port", as the receipt names it
    holdings: Holdings  # what its prefix cache holds
    load: Load
    cost: ServerCost  # what a request would wait there for its first token


@dataclass(slots=True)
class Candidate:
    upstream: Server
    weight: int  # the conversation's rendezvous hash with this server (0 without a conversation)
    predicted: int  # prompt tokens predicted to be in its prefix cache
    own: int  # of which beyond the prefix the prompt shares with other conversations
    index: str  # which index predicted it: "events" or "estimate"
    load: int
    price: Price  # the request's expected time to first token there, and its terms
    home: bool = False
    last: bool = False  # its conversation's last request went here
    kept: int | None = None  # the conversations it keeps lately (conversations.py), where counted: cache-aware

    def score(self, policy: str) -> float:
        """What the policy ranks by (the receipt's numbers): rendezvous its hash, least-loaded minus its load (higher
        first); cache-aware the expected time to first token, in seconds (least first)."""
        if policy == "rendezvous":
            return self.weight / 2**64
        if policy == "least-loaded":
            return -float(self.load)
        return round(self.price.seconds, 6)


@dataclass(slots=True)
class Route:
    """The server chosen for a request, and why."""

    upstream: Server
    policy: str
    reason: str  # home | faster | least_loaded | retry | only
    chosen: Candidate
    runner_up: Candidate | None = None
    moved_from: str | None = None  # the server the conversation's last request went to, when another

    def receipt(self) -> dict:
        """What the upstream event carries (events.py)."""
        chosen, other, price = self.chosen, self.runner_up, self.chosen.price
        body = {"policy": self.policy, "reason": self.reason, "predicted_cached_tokens": chosen.predicted,
                "index": chosen.index, "score": chosen.score(self.policy), "load": chosen.load,
                "expected_ttft": round(price.seconds, 6), "prefill_tokens": price.prefill,
                "queued_tokens": round(price.queued + price.others_tokens), "others_waiting": price.others,
                "prefill_rate": round(price.rate, 1), "decoding": price.decoding,
                "decode_seconds": round(price.per_decoding * price.decoding, 6),
                "overhead_seconds": round(price.overhead, 6), "spread_seconds": round(price.spread, 6),
                "met_queue_seconds": round(price.met, 6)}
        if chosen.kept is not None:
            body["kept_conversations"] = chosen.kept
        if other is not None:
            body.update(runner_up=other.upstream.name, runner_up_score=other.score(self.policy),
                        runner_up_predicted_cached_tokens=other.predicted, runner_up_load=other.load,
                        runner_up_expected_ttft=round(other.price.seconds, 6),
                        runner_up_prefill_tokens=other.price.prefill,
                        runner_up_queued_tokens=round(other.price.queued + other.price.others_tokens),
                        runner_up_spread_seconds=round(other.price.spread, 6),
                        runner_up_met_queue_seconds=round(other.price.met, 6))
            if other.kept is not None:
                body["runner_up_kept_conversations"] = other.kept
        return body


def weight(conversation: str, url: str) -> int:
    # blake2b rather than hash(): the same in every process, so several looptrace processes agree.
    digest = hashlib.blake2b(f"{conversation}\0{url}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def candidates(live: list[Server], conversation: str | None, prompt: PromptBlocks | None,
               shared: int = 0, kept: Mapping[str, int] | None = None, last: str | None = None) -> list[Candidate]:
    """Each live server as a policy sees it, in the order given (ties keep it). `shared`: the prompt's tokens
    another conversation sent first; `kept`: each server's recent conversations; `last`: the server of the
    conversation's last request."""
    out = []
    length = len(prompt.ids) if prompt is not None else 0
    for upstream in live:
        predicted, index = upstream.holdings.predict(prompt) if prompt is not None else (0, "estimate")
        load = upstream.load
        price = upstream.cost.price(max(1, length - predicted) if length else 0)
        out.append(Candidate(upstream, weight(conversation, upstream.url) if conversation else 0, predicted,
                             max(0, predicted - shared), index, load.now, price, last=upstream.name == last,
                             kept=None if kept is None else kept.get(upstream.name, 0)))
    if conversation:
        max(out, key=lambda c: c.weight).home = True
    return out


def _rendezvous(found: list[Candidate], conversation: str | None) -> tuple[list[Candidate], str]:
    if conversation:
        return sorted(found, key=lambda c: c.weight, reverse=True), "home"
    return sorted(found, key=lambda c: c.load), "least_loaded"


def _least_loaded(found: list[Candidate], conversation: str | None) -> tuple[list[Candidate], str]:
    ranked = sorted(found, key=lambda c: (c.load, not c.home))
    best = ranked[0]
    tied = len(ranked) > 1 and ranked[1].load == best.load
    return ranked, "home" if best.home and tied else "least_loaded"


def margin(home: Price, other: Price) -> float:
    """What another server must save on the home's expected time to take the request: NEAR of it, NEAR_SECONDS, and
    more than the two prices can be told apart by (the standard deviation of their difference, each server's misses
    taken as independent). A near-tie: the cache the home has stays in use."""
    return max(NEAR * home.seconds, NEAR_SECONDS, (home.spread**2 + other.spread**2) ** 0.5)


def evens(home: Candidate, other: Candidate) -> bool:
    """Whether moving the conversation off the server of its last request leaves the other keeping no more recent
    conversations than that server: what a move of one that holds no cache of its own yet asks for. It loses no
    cache, but takes the conversation's later turns along, and one request's price at a wave's crest says nothing
    of theirs."""
    return other.kept + 1 <= home.kept - 1


def crowded(home: Price, other: Price) -> bool:
    """Whether the home's queue has lately been long against the other's: the queue the pool's recent requests found
    there (cost.py's `met`) at least CROWDED times the other's, once it averages MET_LEAST requests. A move takes the
    conversation's later turns along too: a wave of turns, which each server drains in its turn, is no reason for
    one."""
    return home.found >= MET_LEAST and home.met > CROWDED * other.met


def _cache_aware(found: list[Candidate], conversation: str | None) -> tuple[list[Candidate], str]:
    if conversation and any(c.own for c in found):  # its cache is where its own prompt is held
        _home(found, max(found, key=lambda c: (c.own, c.weight)))
    elif any(c.last for c in found):  # none held yet: the server its last request went to keeps it
        _home(found, next(c for c in found if c.last))
    ranked = sorted(found, key=lambda c: (c.price.seconds, not c.home))
    home = next((c for c in found if c.home), None)
    if home is None:
        return ranked, "faster"
    ranked.remove(home)
    # Another server takes the request for a saving past the margin, and where the home holds the conversation's own
    # prompt, only off a crowded home: the move reads that prompt again, and its later turns go with it. Where none
    # is held yet, a conversation already under way moves only where that evens the servers' conversations.
    other = next((c for c in ranked if _may_leave(home, c)), None)
    if other is not None and home.price.seconds - other.price.seconds > margin(home.price, other.price):
        ranked.remove(other)
        ranked[:0] = [other, home]
    else:
        ranked.insert(0, home)
    return ranked, "home" if ranked[0].home else "faster"


def _may_leave(home: Candidate, other: Candidate) -> bool:
    if home.own:
        return crowded(home.price, other.price)
    return evens(home, other) if home.last else True


def _home(found: list[Candidate], home: Candidate) -> None:
    for c in found:
        c.home = c is home


POLICIES = {"rendezvous": _rendezvous, "least-loaded": _least_loaded, "cache-aware": _cache_aware}
USES_LOAD = ("least-loaded", "cache-aware")  # the policies for which each server's /metrics is read


def choose(policy: str, live: list[Server], conversation: str | None, prompt: PromptBlocks | None,
           retry: bool = False, shared: int = 0, kept: Mapping[str, int] | None = None,
           last: str | None = None) -> Route:
    """The route for a request among the live servers (in the order in which idle ones should take turns)."""
    ranked, reason = POLICIES[policy](candidates(live, conversation, prompt, shared, kept, last), conversation)
    if len(ranked) == 1:
        reason = "only"
    if retry:
        reason = "retry"
    return Route(ranked[0].upstream, policy, reason, ranked[0], ranked[1] if len(ranked) > 1 else None)
