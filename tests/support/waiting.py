"""Waiting in tests: one poll with a deadline, for what another process or thread does in its own time
(a store written a moment after the answer, a server up, a scrape taken).

A fixed sleep is a guess that fails on a slower machine and wastes time on a faster one; a wait for
something that has no observable sign (a thread's turn, a connection made) is ordered by an event
instead (threading.Event, a queue), never by a sleep.
"""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable, TypeVar, Union

T = TypeVar("T")
What = Union[str, Callable[[], str], None]  # a callable says it at the deadline: a log as it then stands


def wait_until(found: Callable[[], T], timeout: float = 30.0, every: float = 0.1, what: What = None, *,
               or_last: bool = False) -> T:
    """`found()`'s first answer that is something (truthy), asked every `every` seconds; past `timeout`
    an AssertionError saying what was awaited and the last answer (or, `or_last`, that answer, for a
    caller that says itself what is missing)."""
    deadline = time.monotonic() + timeout
    while True:
        value = found()
        if value:
            return value
        if time.monotonic() >= deadline:
            if or_last:
                return value
            raise AssertionError(f"not within {timeout:g} s: {_said(what, found)} (last answer: {value!r})")
        time.sleep(every)


async def wait_until_async(found: Callable[[], T | Awaitable[T]], timeout: float = 30.0, every: float = 0.02,
                           what: What = None) -> T:
    """As wait_until, on an event loop: the loop runs between the questions."""
    deadline = time.monotonic() + timeout
    while True:
        value = found()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout:g} s: {_said(what, found)} (last answer: {value!r})")
        await asyncio.sleep(every)


def _said(what: What, found: Callable) -> str:
    if callable(what):
        return what()
    return what or getattr(found, "__qualname__", None) or repr(found)
