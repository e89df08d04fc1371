"""Token events on the `decode` span, grouped.

One span event per token costs about 20 µs in the OpenTelemetry SDK (it validates every attribute),
which alone would eat most of a token's budget; and the SDK keeps 128 events per span by default.
So tokens are recorded in groups: each `looptrace.tokens` event holds up to GROUP tokens as
parallel arrays, one entry per token: `columns` makes a group of the backends' token events,
`expand` turns groups back into one dict per token.
Nothing is dropped: the span's event limit is raised too, so any length of answer fits.
"""

from __future__ import annotations

from math import exp
from typing import Iterable, Mapping, Sequence

from looptrace.common import attributes as attr
from looptrace.common.token_event import TOP_N, TokenEvent

GROUP = 64  # tokens per event at most
EVENT, PREFIX = attr.EVENT_TOKENS, attr.TOKENS_PREFIX  # the event's name, and what its columns' names start with
TOP_COLUMNS = frozenset(name.removeprefix(PREFIX) for name in attr.TOKENS_TOP_COLUMNS)  # TOP_N slots per token


def columns(events: Sequence[TokenEvent], channels: list[str], times: list[int], pieces: Sequence[str] | None) -> dict:
    """One group's event attributes: the tokens' parallel arrays, with the channel and arrival time of
    each; the top five of each token padded to TOP_N entries. `pieces` (the vocabulary's) is None when
    content is not kept: then ids, pieces and text are left out. Built once per group, off the
    per-token path; the top-five arrays are extended a token at a time, not nested comprehensions
    (a third of this function's cost)."""
    top_p: list[float] = []
    for e in events:
        logprobs = e["top_logprobs"]
        top_p += map(exp, logprobs)
        if len(logprobs) != TOP_N:
            top_p += [-1.0] * (TOP_N - len(logprobs))
    group = {
        attr.TOKENS_INDEX: [e["index"] for e in events],
        attr.TOKENS_TIME_UNIX_NANO: times,
        attr.TOKENS_SPECIAL: [e["special"] for e in events],
        attr.TOKENS_CHANNEL: channels,
        attr.TOKENS_P: [e["p"] for e in events],
        attr.TOKENS_LOGPROB: [e["logprob"] for e in events],
        attr.TOKENS_RANK: [e["rank"] for e in events],
        attr.TOKENS_TOP_P: top_p,
        attr.TOKENS_DRAFTED: [e.get("drafted", 0) for e in events],
        attr.TOKENS_ACCEPTED: [e.get("accepted", 0) for e in events],
        attr.TOKENS_DRAFT_METHOD: [e.get("draft_method", "") for e in events],
    }
    if pieces is not None:
        top_ids: list[int] = []
        for e in events:
            ids = e["top_ids"]
            top_ids += ids
            if len(ids) != TOP_N:
                top_ids += [-1] * (TOP_N - len(ids))
        known = len(pieces)
        group[attr.TOKENS_ID] = [e["id"] for e in events]
        group[attr.TOKENS_PIECE] = [e["piece"] for e in events]
        group[attr.TOKENS_TEXT] = [e["text"] for e in events]
        group[attr.TOKENS_TOP_IDS] = top_ids
        group[attr.TOKENS_TOP_PIECES] = [pieces[i] if 0 <= i < known else "" for i in top_ids]
    return group


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
