"""Handing finished spans to an exporter without ever making the caller wait.

Like the SDK's BatchSpanProcessor (a bounded queue, a background thread, batches), written here
because ours must account for what it loses: the queue is bounded by spans and by bytes, and a span
that does not fit, or a batch the exporter fails, adds to a dropped counter and is remembered by
trace id, so that a sink that can (the trace store) marks those traces incomplete instead of
showing them as whole.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Callable, Protocol

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from looptrace.common import attributes as attr

log = logging.getLogger("looptrace.trace")

MAX_LOST_TRACES = 100_000  # trace ids remembered as incomplete until the sink hears of them


def span_bytes(span: ReadableSpan) -> int:
    """About what a span holds: its strings' lengths, 8 bytes for anything else. An estimate that
    costs a pass over the attributes, not an encoding: this runs on the serving thread."""
    total = 200
    for attrs in (span.attributes, *(event.attributes for event in span.events)):
        if attrs:
            for value in attrs.values():
                if isinstance(value, str):
                    total += len(value)
                elif isinstance(value, (tuple, list)):
                    # Token arrays: their strings are pieces of a few characters.
                    total += 8 * len(value)
                else:
                    total += 8
    return total


class Outgoing(Protocol):
    """What a sink sends of each batch, where that is not the batch itself (the OTLP sink's: otlp.py)."""

    held: int  # spans held back
    held_bytes: int

    def take(self, batch: list[ReadableSpan], everything: bool = False) -> list[ReadableSpan]: ...

    def due_in(self) -> float | None: ...  # seconds until something held back is due (None: nothing held)


class QueueingSpanProcessor(SpanProcessor):
    """`on_lost`, when given, is called on the exporting thread, before each export, with
    {trace_id: spans lost} for the traces that lost spans since the last call. `outgoing`, when given
    (the OTLP sink's: otlp.py), makes each batch what is sent, and may hold spans back a while."""

    def __init__(self, exporter: SpanExporter, *, name: str, on_dropped: Callable[[str, int], None],
                 on_lost: Callable[[dict[int, int]], None] | None = None, max_queue: int = 16384,
                 max_bytes: int = 256 << 20, max_batch: int = 1024, outgoing: Outgoing | None = None,
                 last_flush_seconds: float = 10.0) -> None:
        self.exporter = exporter
        self.last_flush_seconds = last_flush_seconds  # shutdown's bound on writing what is still queued
        self._outgoing = outgoing
        self.name = name
        self._on_dropped = on_dropped
        self._on_lost = on_lost
        self.max_queue, self.max_bytes = max_queue, max_bytes
        self._max_batch = max_batch
        # A deque and a condition rather than queue.Queue: a span in is one append under the lock,
        # and the exporting thread takes a whole batch at once.
        self._spans: deque[tuple[ReadableSpan, int]] = deque()
        self._held_bytes = 0
        self._unfinished = 0  # queued or being exported
        self._in_flight = 0  # spans of the batch being exported
        self._lost: dict[int, int] = {}
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=f"looptrace-export-{name}", daemon=True)
        self._thread.start()

    @property
    def depth(self) -> int:
        """Spans waiting for the sink: queued, or held back (a tool call's, for its result)."""
        return len(self._spans) + (self._outgoing.held if self._outgoing is not None else 0)

    @property
    def held_bytes(self) -> int:
        return self._held_bytes + (self._outgoing.held_bytes if self._outgoing is not None else 0)

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        size = span_bytes(span)
        with self._lock:
            if len(self._spans) < self.max_queue and self._held_bytes + size <= self.max_bytes:
                self._spans.append((span, size))
                self._held_bytes += size
                self._unfinished += 1
                if len(self._spans) == 1:
                    self._wake.notify()
                return
            self._remember_lost((span.context.trace_id,))
        self._on_dropped(self.name, 1)

    def _remember_lost(self, trace_ids) -> None:
        """Called with the lock held."""
        for trace_id in trace_ids:
            if trace_id in self._lost or len(self._lost) < MAX_LOST_TRACES:
                self._lost[trace_id] = self._lost.get(trace_id, 0) + 1
        self._wake.notify()

    def _take(self) -> tuple[list[ReadableSpan], dict[int, int]]:
        """Waits for a span, then takes what is queued (up to a batch) and what was lost since the
        last call. No lingering for a fuller batch: a quiet server's spans are stored at once (the
        trace viewer shows a step as soon as it is stored), and under load the batches fill by
        themselves while the previous one is written."""
        with self._lock:
            while not self._spans and not self._lost and not self._stopping:
                due = self._outgoing.due_in() if self._outgoing is not None else None
                if due == 0:
                    break  # something held back is due
                self._wake.wait(due)
            batch = [self._spans.popleft() for _ in range(min(self._max_batch, len(self._spans)))]
            self._held_bytes -= sum(size for _, size in batch)
            lost, self._lost = self._lost, {}
            self._unfinished += bool(lost)  # until the marks are stored too: force_flush waits for them
        return [span for span, _ in batch], lost

    def _run(self) -> None:
        while True:
            batch, lost = self._take()
            taken = len(batch)
            if self._outgoing is not None:
                batch = self._outgoing.take(batch, everything=self._stopping)
            if lost and self._on_lost is not None:
                try:
                    self._on_lost(lost)
                except Exception:  # noqa: BLE001 - marking is best effort; the spans are counted already
                    log.exception("trace sink %s could not note lost spans", self.name)
            if batch or (lost and self._on_lost is not None):
                self._in_flight = len(batch)
                self._export(batch)  # an empty batch still stores the marks just noted
                self._in_flight = 0
            elif self._stopping:
                return
            with self._lock:
                self._unfinished -= taken + bool(lost)

    def _export(self, batch: list[ReadableSpan]) -> None:
        try:
            result = self.exporter.export(batch)
        except Exception as exc:  # noqa: BLE001 - a failing sink must never take the server down
            log.warning("trace export to %s failed: %s", self.name, exc)
            result = SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS and batch:
            with self._lock:
                self._remember_lost(span.context.trace_id for span in batch)
            self._on_dropped(self.name, len(batch))

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        deadline = time.monotonic() + timeout_millis / 1000
        while time.monotonic() < deadline:
            with self._lock:
                if self._unfinished == 0 and not self._lost:  # queued, exported and marked alike
                    return True
                self._wake.notify()
            time.sleep(0.01)
        return False

    def shutdown(self) -> None:
        # A sink that holds a batch while its server is away (postgres/store.py) lets it go now: what is
        # left is tried once, and what fails is counted, rather than holding the process open.
        interrupt = getattr(self.exporter, "interrupt", None)
        if interrupt is not None:
            interrupt()
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
            self._wake.notify()
        self._thread.join(timeout=self.last_flush_seconds)
        if self._thread.is_alive():  # a sink that does not answer: what it has not taken is let go, counted
            with self._lock:
                left = len(self._spans) + self._in_flight + (self._outgoing.held if self._outgoing else 0)
            if left > 0:
                self._on_dropped(self.name, left)
                log.warning("trace sink %s did not take the last %d spans within %g s of shutdown: they were dropped "
                            "(counted in %s_total)", self.name, left, self.last_flush_seconds,
                            attr.METRIC_TRACE_SPANS_DROPPED)
        self.exporter.shutdown()
