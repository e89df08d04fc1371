"""A prompt's ids set past the SDK's per-element check: the span ends up with what the SDK's own
setter would have given it, on every tracer."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from looptrace.common import attributes as attr
from looptrace.proxy.observe.span_arrays import add_event, set_arrays, take_arrays


def _tracer(limits: SpanLimits | None = None):
    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=limits) if limits else TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("test"), exporter


def _attributes() -> dict:
    return {attr.PROMPT_TEXT: "hello", attr.PROMPT_IDS: [1, 2, 3, 40000], attr.PROMPT_ADDED_IDS: [3, 40000],
            attr.PROMPT_NEW_TEXT: "lo"}


def test_the_arrays_arrive_as_the_sdks_own_setter_leaves_them():
    tracer, exporter = _tracer()
    with tracer.start_as_current_span("sdk", attributes=_attributes()):
        pass
    attributes = _attributes()
    arrays = take_arrays(attributes)
    assert set(arrays) == {attr.PROMPT_IDS, attr.PROMPT_ADDED_IDS} and attr.PROMPT_IDS not in attributes
    span = tracer.start_span("ours", attributes=attributes)
    set_arrays(span, arrays)
    span.end()
    sdk, ours = exporter.get_finished_spans()
    assert dict(ours.attributes) == dict(sdk.attributes)
    assert ours.attributes[attr.PROMPT_IDS] == (1, 2, 3, 40000)
    assert type(ours.attributes[attr.PROMPT_IDS]) is tuple  # immutable, as the exporters expect


def test_the_attribute_limit_still_holds():
    tracer, exporter = _tracer(SpanLimits(max_span_attributes=2))
    span = tracer.start_span("limited", attributes={"a": 1, "b": 2})
    set_arrays(span, {attr.PROMPT_IDS: [5, 6]})
    span.end()
    (done,) = exporter.get_finished_spans()
    assert len(done.attributes) == 2 and done.attributes[attr.PROMPT_IDS] == (5, 6)
    assert done.dropped_attributes == 1


def test_a_tracer_that_records_nothing_takes_them_too():
    span = trace.NoOpTracer().start_span("nothing")
    set_arrays(span, {attr.PROMPT_IDS: [1, 2]})  # the public setter: no error, nothing kept
    add_event(span, "tokens", {"ids": [1]}, 0)
    assert not span.is_recording()


def test_an_events_arrays_are_the_ones_it_was_given():
    tracer, exporter = _tracer()
    span = tracer.start_span("decode")
    ids = [7, 8]
    add_event(span, "tokens", {"ids": ids}, 1)
    ids[0] = 9  # redaction changes them in place before the span ends
    span.end()
    (done,) = exporter.get_finished_spans()
    assert list(done.events[0].attributes["ids"]) == [9, 8]
