"""Token events on the `decode` span, grouped.

One span event per token costs about 20 µs in the OpenTelemetry SDK (it validates every attribute),
which alone would eat most of a token's budget; and the SDK keeps 128 events per span by default.
So tokens are recorded in groups: each `looptrace.tokens` event holds up to GROUP tokens as
parallel arrays, one entry per token, and `expand` turns groups back into one dict per token.
Nothing is dropped: the span's event limit is raised too, so any length of answer fits.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from looptrace.backends.events import TOP_N
from looptrace.common import attributes as attr

GROUP = 64  # tokens per event at most
EVENT, PREFIX = attr.EVENT_TOKENS, attr.TOKENS_PREFIX  # the event's name, and what its columns' names start with


TOP_COLUMNS = frozenset(name.removeprefix(PREFIX) for name in attr.TOKENS_TOP_COLUMNS)  # TOP_N slots per token


def expand(attributes: Mapping) -> list[dict]:
    """One `looptrace.tokens` event's arrays → one dict per token.

    Each token holds TOP_N slots of each top-five array; slots past a short list (a replayed token
    has one candidate) are padding, marked by a top_p of -1. A probability that was not a number
    when recorded (NaN, from an upstream) is stored as JSON null and read back as None.
    """
    columns = {name.removeprefix(PREFIX): list(attributes[name]) for name in attr.TOKENS_COLUMNS if name in attributes}
    count = len(columns.get("index", ()))
    top_p = columns.get("top_p", [])
    tokens = []
    for i in range(count):
        start = i * TOP_N
        # A p the store could not keep (NaN from an upstream reads back as null) is a real slot.
        real = sum(1 for p in top_p[start:start + TOP_N] if p is None or p >= 0)
        token = {}
        for name, values in columns.items():
            token[name] = values[start:start + real] if name in TOP_COLUMNS else values[i]
        tokens.append(token)
    return tokens


def expand_events(events: Iterable[Mapping]) -> list[dict]:
    tokens: list[dict] = []
    for event in events:
        if event.get("name") == EVENT:
            tokens.extend(expand(event.get("attributes", {})))
    return tokens
