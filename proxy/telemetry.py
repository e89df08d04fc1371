"""The process's tracing and metrics: one tracer, one registry, one store, shared by all requests.

Each request gets a `RequestTrace` (request_trace.py) through `Telemetry.request(...)`: the server
span and the request's metrics live exactly as long as the HTTP handler.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from contextlib import asynccontextmanager
from pathlib import Path

from aiohttp import web
from opentelemetry.propagate import extract

from trace_store.setup import build_provider
from trace_store.sqlite import SQLiteTraceStore

from .metrics import Metrics
from .settings import Settings

log = logging.getLogger("looptrace")

# Conversation ids, in the order clients are known to send them: codex (session-id, thread-id),
# pi (session_id, x-session-affinity).
CONVERSATION_HEADERS = ("session-id", "session_id", "thread-id", "x-session-affinity")


def default_trace_db() -> Path:
    from platformdirs import user_data_dir

    return Path(user_data_dir("looptrace")) / "traces.sqlite3"


class Bounded(OrderedDict):
    """A dict that forgets its oldest entries past `size`: memory stays flat however long we run."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def remember(self, key, value) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)


class Telemetry:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.content = settings.trace_content
        self.metrics = Metrics()
        self.store: SQLiteTraceStore | None = None
        if settings.trace_db != "off":
            path = Path(settings.trace_db).expanduser() if settings.trace_db else default_trace_db()
            self.store = SQLiteTraceStore(path, retention_seconds=settings.trace_retention_days * 86400,
                                          max_bytes=int(settings.trace_max_mb * 1024 * 1024))
        self.provider, self.processors = build_provider(
            store=self.store, otlp_endpoint=settings.otlp_endpoint, on_dropped=self.metrics.dropped)
        self.tracer = self.provider.get_tracer("looptrace")
        # What each conversation's model has seen (prompt + output ids), to find what a new request adds.
        self.conversations: Bounded = Bounded(1024)
        # Tool calls waiting for their result to come back in a later request: call id → (span context, name).
        self.pending_calls: Bounded = Bounded(8192)
        self.lock = threading.Lock()  # the rendering thread and the event loop both touch the two above

    @asynccontextmanager
    async def request(self, http: web.Request, endpoint: str):
        from .request_trace import RequestTrace

        trace = RequestTrace(self, http, endpoint, parent=extract(http.headers))
        try:
            yield trace
        except BaseException as exc:
            trace.fail(exc)
            raise
        finally:
            trace.end()

    def flush(self, timeout: float = 10) -> bool:
        return all(p.force_flush(int(timeout * 1000)) for p in self.processors)

    def close(self) -> None:
        self.flush(5)
        self.provider.shutdown()


def conversation_id(headers, body: dict | None) -> str | None:
    for name in CONVERSATION_HEADERS:
        value = headers.get(name)
        if value:
            return value
    key = (body or {}).get("prompt_cache_key")
    return key if isinstance(key, str) and key else None


def client_of(user_agent: str | None) -> tuple[str | None, str | None]:
    """'codex_exec/0.169.0 (Linux; x86_64) …' → ('codex_exec', '0.169.0')."""
    if not user_agent:
        return None, None
    product = user_agent.split()[0]
    name, _, version = product.partition("/")
    return name or None, version or None
