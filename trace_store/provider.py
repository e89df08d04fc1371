"""Where spans go: the trace store (SQLite or PostgreSQL), and OTLP/HTTP to any collector, side by side."""

from __future__ import annotations

from typing import Callable

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased

from .otlp import OutgoingSpans
from .processor import QueueingSpanProcessor

# Prompts are long and a decode span carries every token: lift the SDK's defaults (128 events per
# span, 128 attributes) so nothing is cut; attribute values stay whole (no length limit).
SPAN_LIMITS = SpanLimits(max_events=1_000_000, max_span_attributes=1024, max_event_attributes=256,
                         max_links=1024, max_attributes=1024)


def otlp_traces_url(endpoint: str) -> str:
    """OTLP/HTTP takes spans at /v1/traces; accept the collector's base URL too."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith("/v1/traces") else endpoint + "/v1/traces"


# A collector is a remote server that may never answer: shutdown gives it this long for what is left,
# where the store (a local file, or PostgreSQL with its own interrupt) gets the processor's default.
OTLP_LAST_FLUSH_SECONDS = 3.0


def build_provider(*, store=None, otlp_endpoint: str | None,
                   on_dropped: Callable[[str, int], None], service_name: str = "looptrace",
                   attributes: dict | None = None,
                   content: bool = True) -> tuple[TracerProvider, list[QueueingSpanProcessor]]:
    """`content`: whether spans hold what was said (--trace-content); without it no tool result is
    waited for before an execute_tool span is exported."""
    # With no sink at all, spans are not recorded: no per-token work is done for a trace nobody keeps.
    # (Parent-based, so an incoming sampled traceparent is still not recorded: there is nowhere to put it.)
    sampler = None if store is not None or otlp_endpoint else ParentBased(ALWAYS_OFF, remote_parent_sampled=ALWAYS_OFF)
    provider = TracerProvider(
        resource=Resource.create({"service.name": service_name, **(attributes or {})}),
        span_limits=SPAN_LIMITS,
        shutdown_on_exit=False,
        **({"sampler": sampler} if sampler else {}),
    )
    processors = []
    if store is not None:
        # Named after the store ("sqlite", "postgresql"): the metrics' `sink` label.
        processors.append(QueueingSpanProcessor(store, name=store.sink, on_dropped=on_dropped, on_lost=store.note_lost))
    if otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter,
        )

        exporter = OTLPSpanExporter(endpoint=otlp_traces_url(otlp_endpoint), timeout=10)
        # Whole spans, tool calls with their results (otlp.py): from the store where another process took the turn.
        outgoing = OutgoingSpans(hold=content, lookup=store.tool_results if store is not None else None)
        processors.append(QueueingSpanProcessor(exporter, name="otlp", on_dropped=on_dropped, outgoing=outgoing,
                                                last_flush_seconds=OTLP_LAST_FLUSH_SECONDS))
    for processor in processors:
        provider.add_span_processor(processor)
    return provider, processors
