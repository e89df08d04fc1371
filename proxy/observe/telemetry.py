"""The process's tracing and metrics: one tracer, one registry, one store, shared by all requests.

Each request gets a `RequestTrace` (request_trace.py) from `start_request`: the API layer opens it
when a request arrives and ends it when the handler returns.
"""

from __future__ import annotations

from opentelemetry.context import Context

from looptrace.trace_store.provider import build_provider
from looptrace.trace_store.sqlite import SQLiteTraceStore, store_path

from ..settings import Settings
from .conversations import Conversations
from .feed import LiveFeed
from .metrics import Metrics
from .request_trace import RequestTrace


class Telemetry:
    def __init__(self, settings: Settings) -> None:
        self.content = settings.trace_content
        self.metrics = Metrics()
        self.feed = LiveFeed()
        path = store_path(settings.trace_db)
        self.store: SQLiteTraceStore | None = None
        if path is not None:
            self.store = SQLiteTraceStore(path, retention_seconds=settings.trace_retention_days * 86400,
                                          max_bytes=int(settings.trace_max_mb * 1024 * 1024),
                                          on_written=self.feed.publish)
            self.store.open()
        self.provider, self.processors = build_provider(
            store=self.store, otlp_endpoint=settings.otlp_endpoint, on_dropped=self.metrics.dropped)
        for processor in self.processors:
            self.metrics.watch_queue(processor.name, lambda p=processor: p.depth, lambda p=processor: p.held_bytes)
        self.tracer = self.provider.get_tracer("looptrace")
        self.conversations = Conversations()

    def start_request(self, endpoint: str, parent: Context | None, attributes: dict) -> RequestTrace:
        """`attributes`: what the API knows of the HTTP request (method, path, the client)."""
        return RequestTrace(self.tracer, self.metrics, self.conversations, content=self.content,
                            endpoint=endpoint, parent=parent, attributes=attributes)

    def flush(self, timeout: float = 10) -> bool:
        return all(p.force_flush(int(timeout * 1000)) for p in self.processors)

    def close(self) -> None:
        self.flush(5)
        self.provider.shutdown()
