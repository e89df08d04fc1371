"""Arrays of thousands of values into spans, deliberately past the SDK's public setters: those check
every element of every array again, in Python (a 5,000-token prompt's ids: about a millisecond, more
than the rest of its render span), and these arrays are built here, of plain ints, floats, bools and
strings. Where the span is not the SDK's own (a no-op tracer), the public setters do it."""

from __future__ import annotations

from types import MappingProxyType

from opentelemetry.sdk.trace import Event

from looptrace.common import attributes as attr

# The render span's: a prompt's ids, whole or what it adds.
ID_ARRAYS = (attr.PROMPT_IDS, attr.PROMPT_ADDED_IDS)


def take_arrays(attributes: dict, keys=ID_ARRAYS) -> dict:
    """The arrays of `keys` that `attributes` holds, taken out of it: set after the span starts."""
    return {key: attributes.pop(key) for key in keys if key in attributes}


def set_arrays(span, arrays: dict) -> None:
    """`arrays` as attributes of `span`, each a tuple, as the SDK's own cleaning leaves it."""
    if not arrays:
        return
    bounded = getattr(span, "_attributes", None)
    setitem = getattr(bounded, "_setitem_locked", None)
    lock = getattr(bounded, "_lock", None)
    if setitem is None or lock is None or not span.is_recording():
        span.set_attributes(arrays)
        return
    with lock:
        for key, values in arrays.items():
            setitem(key, tuple(values))


def add_event(span, name: str, attributes: dict, timestamp: int) -> None:
    """An event whose attributes' arrays are kept as they are (the token groups', changed in place
    until the span ends: span_records.redact_tokens)."""
    add = getattr(span, "_add_event", None)
    if add is None:
        span.add_event(name, attributes, timestamp)
    else:
        add(Event(name, MappingProxyType(attributes), timestamp))
