"""What a stored trace holds, whichever store keeps it: a span row's columns, the tool-call outcomes a
session counts, which span is a trace's request, and text as a store can hold it."""

from __future__ import annotations

from looptrace.common import attributes as attr


def request_span(spans: list[dict]) -> dict | None:
    """A stored trace's request (server) span: the one marked with its endpoint. It has a parent when
    the client sent a traceparent, so "the span without a parent" is not it."""
    return next((s for s in spans if attr.ENDPOINT in s["attributes"]), None)


def span_named(trace: dict, name: str) -> dict:
    """A stored trace's span of that name (render, decode), or an empty one: no tokens, no attributes."""
    found = next((s for s in trace["spans"] if s["name"] == name), None)
    return {"tokens": [], "attributes": {}, **(found or {})}


SPAN_COLUMNS = ("trace_id", "span_id", "parent_id", "name", "kind", "start_ns", "end_ns", "status", "attributes",
                "events", "links", "tokens")


OUTCOMES = ("valid", "invalid_args", "unknown_tool", "unparsed")


def storable(value: str) -> str:
    """Text as a store can hold and look for it: NUL (PostgreSQL's text has none; FTS5 ends a phrase
    at one) and lone surrogates (UTF-8 has none) become U+FFFD. A client may send either."""
    if "\x00" in value:
        value = value.replace("\x00", "\ufffd")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            value = value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return value
