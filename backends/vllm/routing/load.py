"""A vLLM server's load, as routing reads it (policies.py): its requests in flight now, and the server's own counts
of those running and waiting.

In flight is the larger of this process's own count (known at once) and the server's (its /metrics' requests
running plus waiting, read every second by the pool for the policies that weigh load: every looptrace process's
requests, and any other client's). The cost model (cost.py) reads the two counts apart: a waiting request
looptrace did not send is prefill ahead of the next one, a running one may be decoding.
"""

from __future__ import annotations


class Load:
    """One server's load: `now` (requests in flight), and `running` and `waiting` as it last said."""

    __slots__ = ("own", "running", "waiting")

    def __init__(self) -> None:
        self.own = 0  # this process's requests streaming from it
        self.running = 0  # as the server last said (every process's)
        self.waiting = 0

    @property
    def now(self) -> int:
        return max(self.own, self.running + self.waiting)

    def set_own(self, value: int) -> None:
        self.own = value

    def report(self, running: int, waiting: int) -> None:
        self.running, self.waiting = running, waiting
