"""A vLLM server's load, as routing weighs it (routing.py): its requests in flight now, and that averaged
over the last BUSY_SECONDS, so that a burst can be told from a server that stays busy.

In flight is the larger of this process's own count (known at once) and the server's (its /metrics'
requests running and waiting, read every second by the pool: every looptrace process's requests). The
average is exponential in time, brought up to date whenever either count changes or is read.
"""

from __future__ import annotations

import math
import time

BUSY_SECONDS = 10.0  # the time constant of a server's averaged load


class Load:
    """One server's load: `now` (requests in flight) and `busy` (that, averaged over about BUSY_SECONDS)."""

    __slots__ = ("own", "reported", "_busy", "_at")

    def __init__(self) -> None:
        self.own = 0  # this process's requests streaming from it
        self.reported = 0  # running and waiting, as the server last said (every process's)
        self._busy = 0.0
        self._at = time.monotonic()

    @property
    def now(self) -> int:
        return max(self.own, self.reported)

    def _settle(self) -> None:
        """`busy` brought up to now: the load held constant since the last change decays the average toward it."""
        t = time.monotonic()
        if t > self._at:
            now = self.now
            self._busy = now + (self._busy - now) * math.exp((self._at - t) / BUSY_SECONDS)
            self._at = t

    def set_own(self, value: int) -> None:
        self._settle()
        self.own = value

    def report(self, value: int) -> None:
        self._settle()
        self.reported = value

    @property
    def busy(self) -> float:
        self._settle()
        return self._busy
