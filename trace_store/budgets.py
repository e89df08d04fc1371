"""What each API key has used of its budgets (`--requests-per-minute`, `--tokens-per-day`), kept in the
trace store's state beside the keys (api_keys.py), so every `--workers` process and every host sharing
the store counts against the same numbers.

One row per key, kind and window: requests in fixed minutes (a UTC minute), tokens in UTC days. A
request is admitted by one transaction (one round trip on PostgreSQL, its statements pipelined) that
takes a slot of its minute only while the minute has one left and the day's tokens are not spent: two
workers cannot both take the last slot, since the row's update is the test. Tokens are charged when
a turn ends (an upsert that adds them), so a turn that starts within the day's budget may end past it;
the next one is refused.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from .state import StateStore

MINUTE, DAY = 60, 86_400
PRUNE_EVERY = 64  # windows past are deleted every this many writes
REQUESTS, TOKENS = "requests", "tokens"

# The minute's row made if it is not there yet, so that the slot's update below always has a row to test.
OPEN_MINUTE = "INSERT INTO budget_use VALUES (?, 'requests', ?, 0) ON CONFLICT (name, kind, starts) DO NOTHING"
# A slot taken, while one is left and (when the key has a token budget) the day's tokens are not spent.
TAKE_SLOT = "UPDATE budget_use SET used = used + 1 WHERE name = ? AND kind = 'requests' AND starts = ? AND used < ?"
TOKENS_LEFT = (" AND NOT EXISTS (SELECT 1 FROM budget_use AS d WHERE d.name = ? AND d.kind = 'tokens' AND d.starts = ?"
               " AND d.used >= ?)")
# Matches (and so counts 1) only where the day's tokens are spent: how a transaction that returns row
# counts alone asks the question. It changes nothing, and touches a row only when it refuses.
SPENT = "UPDATE budget_use SET used = used WHERE name = ? AND kind = 'tokens' AND starts = ? AND used >= ?"
CHARGE = ("INSERT INTO budget_use AS b VALUES (?, 'tokens', ?, ?) ON CONFLICT (name, kind, starts) "
          "DO UPDATE SET used = b.used + excluded.used")
PRUNE = "DELETE FROM budget_use WHERE (kind = 'requests' AND starts < ?) OR (kind = 'tokens' AND starts < ?)"


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request was refused, and when the window that refused it frees."""

    reason: str  # REQUESTS or TOKENS
    limit: int
    retry_after: int  # whole seconds, at least 1


class BudgetStore:
    """The budget_use table, over a StateStore's connection (SQLite or PostgreSQL)."""

    def __init__(self, state: StateStore) -> None:
        self.state = state
        self._writes = 0

    def admit(self, name: str, requests_per_minute: int | None, tokens_per_day: int | None,
              now: float | None = None) -> Refusal | None:
        """A request of key `name`, counted in its minute: None, or why it is refused (and not counted
        against the minute)."""
        now = time.time() if now is None else now
        minute, day = _start(now, MINUTE), _start(now, DAY)
        statements = []
        if tokens_per_day is not None:
            statements.append((SPENT, (name, day, tokens_per_day)))
        if requests_per_minute is not None:
            take = (TAKE_SLOT, (name, minute, requests_per_minute))
            if tokens_per_day is not None:
                take = (TAKE_SLOT + TOKENS_LEFT, take[1] + (name, day, tokens_per_day))
            statements += [(OPEN_MINUTE, (name, minute)), take]
        if not statements:
            return None
        counts = self.state._write(self._pruning(statements, now))
        if tokens_per_day is not None and counts[0] > 0:
            return Refusal(TOKENS, tokens_per_day, _until(now, day + DAY))
        if requests_per_minute is not None and counts[len(statements) - 1] == 0:
            return Refusal(REQUESTS, requests_per_minute, _until(now, minute + MINUTE))
        return None

    def charge(self, name: str, tokens: int, now: float | None = None) -> None:
        """A turn's tokens (its prompt's and what it generated) added to the key's day."""
        if tokens <= 0:
            return
        now = time.time() if now is None else now
        self.state._write(self._pruning([(CHARGE, (name, _start(now, DAY), tokens))], now))

    def used(self, name: str, kind: str, now: float | None = None) -> int:
        """What the key used in the window `now` falls in (its minute's requests, its day's tokens)."""
        now = time.time() if now is None else now
        starts = _start(now, MINUTE if kind == REQUESTS else DAY)
        (rows,) = self.state._read([("SELECT used FROM budget_use WHERE name = ? AND kind = ? AND starts = ?",
                                     (name, kind, starts))])
        return rows[0][0] if rows else 0

    def _pruning(self, statements: list, now: float) -> list:
        self._writes += 1
        if self._writes % PRUNE_EVERY == 1 % PRUNE_EVERY:  # the first write, then every PRUNE_EVERY-th
            statements = statements + [(PRUNE, (_start(now, MINUTE) - MINUTE, _start(now, DAY)))]
        return statements


def _start(now: float, length: int) -> int:
    return int(now) // length * length


def _until(now: float, end: int) -> int:
    return max(1, math.ceil(end - now))
