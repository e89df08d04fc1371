"""Token events on the `decode` span, grouped.

One span event per token costs about 20 µs in the OpenTelemetry SDK (it validates every attribute),
which alone would eat most of a token's budget; and the SDK keeps 128 events per span by default.
So tokens are recorded in groups: each `looptrace.tokens` event holds up to GROUP tokens as
parallel arrays, one entry per token, and `expand` turns groups back into one dict per token.
Nothing is dropped: the span's event limit is raised too, so any length of answer fits.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from backends.base import TOP_N

EVENT = "looptrace.tokens"
GROUP = 64
PREFIX = "looptrace.tokens."

# Per-token fields, in the order the arrays are kept; the *_top ones hold TOP_N entries per token.
CONTENT_FIELDS = ("id", "piece", "text", "top_ids", "top_pieces")  # left out with --no-trace-content
FIELDS = ("index", "time_unix_nano", "id", "piece", "text", "special", "channel", "p", "logprob", "rank",
          "top_ids", "top_pieces", "top_p", "drafted", "accepted")
TOP_FIELDS = ("top_ids", "top_pieces", "top_p")


def expand(attributes: Mapping) -> list[dict]:
    """One `looptrace.tokens` event's arrays → one dict per token."""
    columns = {f: list(attributes[PREFIX + f]) for f in FIELDS if PREFIX + f in attributes}
    count = len(columns.get("index", ()))
    tokens = []
    for i in range(count):
        token = {}
        for name, values in columns.items():
            if name in TOP_FIELDS:
                token[name] = [v for v in values[i * TOP_N:(i + 1) * TOP_N] if v != -1 and v != ""]
            else:
                token[name] = values[i]
        tokens.append(token)
    return tokens


def expand_events(events: Iterable[Mapping]) -> list[dict]:
    tokens: list[dict] = []
    for event in events:
        if event.get("name") == EVENT:
            tokens.extend(expand(event.get("attributes", {})))
    return tokens
