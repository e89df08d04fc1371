"""Handing finished spans to an exporter without ever making the caller wait.

Like the SDK's BatchSpanProcessor (a bounded queue, a background thread, batches), written here
because ours must count what it loses: a full queue or a failed export adds to a dropped counter
instead of vanishing into a log line.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Callable

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

log = logging.getLogger("looptrace.trace")


class QueueingSpanProcessor(SpanProcessor):
    def __init__(self, exporter: SpanExporter, *, name: str, on_dropped: Callable[[str, int], None],
                 max_queue: int = 8192, max_batch: int = 256, interval: float = 0.5) -> None:
        self.exporter = exporter
        self.name = name
        self._on_dropped = on_dropped
        self._queue: queue.Queue = queue.Queue(maxsize=max_queue)
        self._max_batch = max_batch
        self._interval = interval
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"looptrace-export-{name}", daemon=True)
        self._thread.start()

    @property
    def depth(self) -> int:
        return self._queue.qsize()

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        try:
            self._queue.put_nowait(span)
        except queue.Full:
            self._on_dropped(self.name, 1)

    def _run(self) -> None:
        while not self._stopping.is_set() or not self._queue.empty():
            try:
                first = self._queue.get(timeout=self._interval)
            except queue.Empty:
                continue
            batch = [first]
            while len(batch) < self._max_batch:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            self._export(batch)
            for _ in batch:
                self._queue.task_done()

    def _export(self, batch: list[ReadableSpan]) -> None:
        try:
            result = self.exporter.export(batch)
        except Exception as exc:  # noqa: BLE001 - a failing sink must never take the server down
            log.warning("trace export to %s failed: %s", self.name, exc)
            result = SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            self._on_dropped(self.name, len(batch))

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        deadline = time.monotonic() + timeout_millis / 1000
        while time.monotonic() < deadline:
            if self._queue.unfinished_tasks == 0:  # queued and exported alike
                return True
            time.sleep(0.01)
        return False

    def shutdown(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=10)
        self.exporter.shutdown()
