"""Which vLLM server takes a request: the policies of --routing, in one table, and the receipt each choice
leaves (`Route`), which the decode span, the metrics and the trace viewer show.

    rendezvous    a conversation goes to its home: the server of the highest hash of (conversation, server
                  URL) among those that answer. No table, the same in every looptrace process; a server that
                  leaves moves only its own conversations. Blind to load and to what each server holds.
    least-loaded  the server with the fewest requests running and waiting; ties go to the home, so that
                  a conversation keeps its cache while the servers are evenly loaded.
    cache-aware   the server predicted to hold the most of this conversation's own prompt (kv_index.py: beyond
                  the prefix it shares with other conversations, a system prompt every server soon holds), among
                  those not overloaded; ties go to the home, then to the least loaded. A server is overloaded when
                  its load averaged over the last BUSY_SECONDS passes BALANCE × the servers' mean (and at least
                  one request), and it has more requests in flight now than the least loaded: a burst does not
                  move a conversation off its cache, a lasting imbalance does (load.py).

A request without a conversation goes to the least loaded server (idle ones take turns), by every policy
but cache-aware, which still prefers the server holding most of its prompt (a shared system prompt).

A server's load is its requests running and waiting: vLLM's own count (its /metrics, read every
LOAD_SECONDS, which counts every looptrace process's requests) or this process's own (known at once),
whichever is larger.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .kv_index import PromptBlocks
    from .upstream import Upstream

BALANCE = 1.5  # cache-aware: a server busier than this × the mean (its load averaged: load.py) is overloaded
LOAD_SECONDS = 1.0  # between readings of each server's /metrics, for the policies that weigh load


@dataclass(slots=True)
class Candidate:
    upstream: Upstream
    weight: int  # the conversation's rendezvous hash with this server (0 without a conversation)
    predicted: int  # prompt tokens predicted to be in its prefix cache
    own: int  # of which beyond the prefix the prompt shares with other conversations
    index: str  # which index predicted it: "events" or "estimate"
    load: int
    busy: float
    home: bool = False
    overloaded: bool = False

    def score(self, policy: str) -> float:
        """What the policy ranks by, higher first (the receipt's numbers)."""
        if policy == "rendezvous":
            return self.weight / 2**64
        if policy == "least-loaded":
            return -float(self.load)
        return float(self.own)


@dataclass(slots=True)
class Route:
    """The server chosen for a request, and why."""

    upstream: Upstream
    policy: str
    reason: str  # home | prefix | least_loaded | home_overloaded | retry | only
    chosen: Candidate
    runner_up: Candidate | None = None
    moved_from: str | None = None  # the server the conversation's last request went to, when another

    def receipt(self) -> dict:
        """What the upstream event carries (events.py)."""
        chosen, other = self.chosen, self.runner_up
        body = {"policy": self.policy, "reason": self.reason, "predicted_cached_tokens": chosen.predicted,
                "index": chosen.index, "score": chosen.score(self.policy), "load": chosen.load}
        if other is not None:
            body.update(runner_up=other.upstream.name, runner_up_score=other.score(self.policy),
                        runner_up_predicted_cached_tokens=other.predicted, runner_up_load=other.load)
        return body


def weight(conversation: str, url: str) -> int:
    # blake2b rather than hash(): the same in every process, so several looptrace processes agree.
    digest = hashlib.blake2b(f"{conversation}\0{url}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def candidates(live: list[Upstream], conversation: str | None, prompt: PromptBlocks | None,
               shared: int = 0) -> list[Candidate]:
    """Each live server as a policy sees it, in the order given (ties keep it). `shared`: the prompt's tokens
    another conversation sent first."""
    out = []
    for upstream in live:
        predicted, index = upstream.holdings.predict(prompt) if prompt is not None else (0, "estimate")
        load = upstream.load
        out.append(Candidate(upstream, weight(conversation, upstream.url) if conversation else 0, predicted,
                             max(0, predicted - shared), index, load.now, load.busy))
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


def _cache_aware(found: list[Candidate], conversation: str | None) -> tuple[list[Candidate], str]:
    mean = sum(c.busy for c in found) / len(found)
    least = min(c.load for c in found)
    for c in found:
        c.overloaded = c.busy > max(BALANCE * mean, 1.0) and c.load > least
    ranked = sorted(found, key=lambda c: (c.overloaded, -c.own, not c.home, c.load))
    best = ranked[0]
    home = next((c for c in found if c.home), None)
    if home is not None and home.overloaded and best is not home:
        return ranked, "home_overloaded"
    runner = ranked[1] if len(ranked) > 1 else None
    if runner is not None and best.own > runner.own:
        return ranked, "prefix"
    return ranked, "home" if best.home else "least_loaded"


POLICIES = {"rendezvous": _rendezvous, "least-loaded": _least_loaded, "cache-aware": _cache_aware}
USES_LOAD = ("least-loaded", "cache-aware")  # the policies for which each server's /metrics is read


def choose(policy: str, live: list[Upstream], conversation: str | None, prompt: PromptBlocks | None,
           retry: bool = False, shared: int = 0) -> Route:
    """The route for a request among the live servers (in the order in which idle ones should take turns)."""
    ranked, reason = POLICIES[policy](candidates(live, conversation, prompt, shared), conversation)
    if len(ranked) == 1:
        reason = "only"
    if retry:
        reason = "retry"
    return Route(ranked[0].upstream, policy, reason, ranked[0], ranked[1] if len(ranked) > 1 else None)
