"""Calls from a request into the shared state store (trace_store/state.py), which any process serving
that store reads and writes: on threads of their own, each answered within WAIT seconds or not at all.
After a call goes unanswered the store is left alone for DOWN_SECONDS, and the caller serves from its
own memory (memory.py, proxy/observe/conversations.py), saying so once in the log: a store that does
not answer never fails or holds up a request for longer than that."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

log = logging.getLogger("looptrace")

WAIT = 1.0  # seconds a request waits for the store's answer, at most
DOWN_SECONDS = 5.0  # after a store failed to answer, it is not asked again for this long
UNANSWERED = object()  # what `answer` gives for a call the store did not answer


class StateCalls:
    def __init__(self, where: str, what: str, threads: int = 4) -> None:
        """`where`: the store, as the log names it; `what`: the state asked for, as the log says it."""
        self.where, self.what = where, what
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="looptrace-state")
        self._down_until = 0.0

    @property
    def up(self) -> bool:
        return time.monotonic() >= self._down_until

    def submit(self, call: Callable, *args, **kwargs) -> Future | None:
        """The call, started on a thread of its own; None while the store is left alone."""
        return self._pool.submit(call, *args, **kwargs) if self.up else None

    def answer(self, future: Future | None):
        """The call's result within WAIT, or UNANSWERED (and the store is left alone for a while)."""
        if future is None:
            return UNANSWERED
        try:
            return future.result(WAIT)
        except Exception as exc:  # noqa: BLE001 - a store that does not answer must not fail a request
            if self.up:
                log.warning("%s in %s does not answer (%s): serving from this process's memory for %g s",
                            self.what, self.where, str(exc).strip() or type(exc).__name__, DOWN_SECONDS)
            self._down_until = time.monotonic() + DOWN_SECONDS
            return UNANSWERED

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
