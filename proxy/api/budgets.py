"""A key's budgets (`looptrace keys create NAME --requests-per-minute N --tokens-per-day N`), enforced on
every generating request (serving.traced), counted in the trace store so that every worker and host
sharing it counts against the same numbers (trace_store/budgets.py).

- Requests per minute are taken before the request runs: the request over the limit is answered 429
  before its body is read, and nothing is generated.
- Tokens per day (its prompt's and what it generated) are charged when a turn ends, and checked before
  the next one starts: a turn that starts within the budget runs whole.

A refusal is a 429 in the API's own error shape (OpenAI's `type` "requests" or "tokens", `code`
"rate_limit_exceeded"; Anthropic's rate_limit_error) with `Retry-After`, the seconds until the window
that refused it frees. A request costs one store transaction before it runs (none for a key without
budgets), and one after it, for a key with a token budget; both off the event loop. A store that fails
admits the request and says so in the log: the counters are a budget, not a lock on serving.
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web

from looptrace.trace_store.budgets import REQUESTS, BudgetStore, Refusal

from ..engine.observer import Observer
from .auth import OPEN, Caller
from .errors import APIError

log = logging.getLogger("looptrace")

SAY_EVERY = 60.0  # seconds between two log lines about a store that fails to count


class RateLimited(APIError):
    """A 429 that says when to come back (Retry-After), in whichever shape the route's API registered."""

    def __init__(self, key: str, refusal: Refusal) -> None:
        what = "requests per minute (RPM)" if refusal.reason == REQUESTS else "tokens per day (TPD)"
        super().__init__(429, f"Rate limit reached for API key {key} on {what}: Limit {refusal.limit}. Please try "
                         f"again in {refusal.retry_after}s.", type=refusal.reason, code="rate_limit_exceeded")
        self.retry_after = refusal.retry_after

    def response(self, shape=None) -> web.Response:
        answer = super().response(shape)
        answer.headers["Retry-After"] = str(self.retry_after)
        return answer


class Budgets:
    """This process's door to the counters: admits a caller's request, and charges its tokens after."""

    def __init__(self, state, metrics) -> None:
        self.store = BudgetStore(state) if state is not None else None  # no store: no keys, so no budgets
        self.metrics = metrics
        self._said = -SAY_EVERY

    async def admit(self, caller: Caller) -> Spending | None:
        """The request admitted, and what will count its tokens (None: a caller with no key, not counted);
        a RateLimited where a budget refuses it."""
        if caller is OPEN:
            return None
        self.metrics.key_requests.labels(caller.name).inc()
        if self.store is not None and (caller.requests_per_minute is not None or caller.tokens_per_day is not None):
            refusal = await self._counted(self.store.admit, caller.name, caller.requests_per_minute,
                                          caller.tokens_per_day)
            if refusal is not None:
                self.metrics.key_refused.labels(caller.name, refusal.reason).inc()
                raise RateLimited(caller.name, refusal)
        return Spending(self, caller)

    async def charge(self, caller: Caller, tokens: int) -> None:
        self.metrics.key_tokens.labels(caller.name).inc(tokens)
        if self.store is not None and caller.tokens_per_day is not None and tokens > 0:
            # Shielded: a client that leaves as its turn ends has still spent the turn's tokens.
            await asyncio.shield(self._counted(self.store.charge, caller.name, tokens))

    async def _counted(self, call, *args) -> Refusal | None:
        try:
            return await asyncio.to_thread(call, *args)
        except Exception as exc:  # noqa: BLE001 - a store that cannot count must not stop serving
            if time.monotonic() - self._said >= SAY_EVERY:
                self._said = time.monotonic()
                log.warning("budgets could not be counted in the store at %s (%s): requests are served as if "
                            "within them", self.store.state.where, str(exc).strip() or type(exc).__name__)
            return None


class Spending(Observer):
    """An observer of the request's generations (a compaction's is one more): what they read and generated,
    read when the request ends, whether it finished or its client left."""

    def __init__(self, budgets: Budgets, caller: Caller) -> None:
        self.budgets, self.caller = budgets, caller
        self.generations: list = []

    def rendered(self, generation, started_ns: int, ended_ns: int, content: bool = True) -> None:
        if generation not in self.generations:
            self.generations.append(generation)

    @property
    def tokens(self) -> int:
        # A prompt refused before the backend read it (too long for the context) cost nothing.
        return sum((g.prompt_tokens if g.prefill_event is not None else 0) + g.completion_tokens
                   for g in self.generations)

    async def end(self) -> None:
        await self.budgets.charge(self.caller, self.tokens)


BUDGETS: web.AppKey[Budgets] = web.AppKey("budgets", Budgets)
