"""The process's tracing and metrics: one tracer, one registry, one store, shared by all requests.

Each request gets a `RequestTelemetry` from `start_request`: the API layer opens it when a request
arrives and ends it when the handler returns. It holds the request's two observers, its spans
(request_spans.py) and its metrics (request_metrics.py), which the engine's Generation is given.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from concurrent.futures import ThreadPoolExecutor

from opentelemetry.context import Context

from looptrace.common.redaction import Redactor, redacting_logs
from looptrace.trace_store.api_keys import server_secret
from looptrace.trace_store.location import open_state, open_store
from looptrace.trace_store.provider import build_provider
from looptrace.trace_store.rollouts import Rollouts

from ..engine.memory import Bounded
from ..settings import Settings
from .conversations import Conversations, StoredConversations
from .feed import LiveFeed
from .metrics import Metrics
from .request_metrics import RequestMetrics
from .request_spans import RequestSpans

log = logging.getLogger("looptrace")


class Telemetry:
    def __init__(self, settings: Settings) -> None:
        self.content = settings.trace_content
        self.redactor = redactor(settings)
        self.exported = bool(settings.otlp_endpoint)  # spans go over OTLP too: whole, with what Phoenix reads
        self.metrics = Metrics()
        self.feed = LiveFeed()
        # The store (SQLite, PostgreSQL, or none) and, beside it, the state any process serving it
        # needs for a conversation's next turn; with no store, that state is this process's alone.
        self.store = open_store(settings.trace_db, retention_seconds=settings.trace_retention_days * 86400,
                                max_bytes=int(settings.trace_max_mb * 1024 * 1024), on_written=self.feed.publish)
        self.state = open_state(settings.trace_db)
        self.provider, self.processors = build_provider(
            store=self.store, otlp_endpoint=settings.otlp_endpoint, on_dropped=self.metrics.dropped,
            content=self.content)
        for processor in self.processors:
            self.metrics.watch_queue(processor.name, lambda p=processor: p.depth, lambda p=processor: p.held_bytes)
        self.tracer = self.provider.get_tracer("looptrace")
        self.conversations = StoredConversations(self.state) if self.state is not None else Conversations()
        # Rollouts (agent RL): each noted once per process (and again when its group changes), off the loop.
        self.rollouts = Rollouts(self.state) if self.state is not None else None
        self._noted: Bounded = Bounded(4096)
        self._noting = ThreadPoolExecutor(1, thread_name_prefix="looptrace-rollouts")

    def start_request(self, endpoint: str, parent: Context | None, attributes: dict) -> RequestTelemetry:
        """`attributes`: what the API knows of the HTTP request (method, path, the client)."""
        spans = RequestSpans(self.tracer, self.conversations, content=self.content, endpoint=endpoint,
                             parent=parent, attributes=attributes, exported=self.exported, redactor=self.redactor)
        return RequestTelemetry(self, spans, RequestMetrics(self.metrics, endpoint=endpoint, trace_id=spans.trace_id))

    def note_rollout(self, key: str, group: str | None) -> None:
        """A rollout's request arrived: its group is kept for the viewer and /v1/rollouts to filter on.
        Never waited for: a store that fails is logged, and serving goes on."""
        if self.rollouts is None or self._noted.get(key, False) == group:
            return
        self._noted.remember(key, group)
        self._noting.submit(self._note, key, group)

    def _note(self, key: str, group: str | None) -> None:
        try:
            self.rollouts.note(key, group)
        except Exception as exc:  # noqa: BLE001 - the store failing never breaks serving
            self._noted.pop(key, None)
            log.warning("rollout %r could not be noted in %s: %s", key, self.rollouts.where, exc)

    def flush(self, timeout: float = 10) -> bool:
        return all(p.force_flush(int(timeout * 1000)) for p in self.processors)

    def close(self) -> None:
        # Each sink's shutdown writes what is queued within its own bound (a dead collector's is short:
        # provider.py), rather than one flush waiting on the slowest sink first.
        self.provider.shutdown()
        self._noting.shutdown(wait=True, cancel_futures=False)
        self.conversations.close()


def redactor(settings: Settings) -> Redactor | None:
    """What replaces credentials in what is recorded and logged, its markers hashed under a key derived
    from the server's secret (outside the store: trace_store/api_keys.py), so every process sharing it
    marks a secret alike; None with `--redact off`, said loudly."""
    if not settings.redact:
        log.warning("--redact off: credentials in prompts, tool calls and answers are stored, exported and "
                    "logged as they are")
        redacting_logs(None)
        return None
    key = hmac.new(server_secret(), b"looptrace redaction markers", hashlib.sha256).digest()
    made = Redactor(key)
    redacting_logs(made)
    return made


class RequestTelemetry:
    """One request's spans and metrics, as the API layer talks to them: what the adapter learns of the
    request goes to whichever needs it, and `observers` is what the request's Generation is given."""

    def __init__(self, telemetry: Telemetry, spans: RequestSpans, metrics: RequestMetrics) -> None:
        self.telemetry = telemetry
        self.spans = spans
        self.metrics = metrics
        self.observers = (spans, metrics)
        self.trace_id = spans.trace_id  # None when the trace is kept nowhere
        self.status = 200
        self.error_type: str | None = None

    def requested(self, model: str, *, stream: bool, conversation: str | None, group: str | None = None,
                  rollout: bool = False, line: str | None = None) -> None:
        """`conversation`: the session; `line`: the agent's conversation line in it (api/agents.py), the
        session's own by default. `rollout`: the conversation is a rollout (agent RL), of `group` if one was named."""
        self.spans.requested(model, stream=stream, conversation=conversation, group=group, line=line)
        self.metrics.requested(model)
        if rollout and conversation is not None:
            self.telemetry.note_rollout(conversation, group)

    def checked(self) -> None:
        """The model asked for is the one served: from here on it labels the request's metrics.
        Until then it is "unknown", so that no string a client sends becomes a label value."""
        self.metrics.checked()

    def responded(self, response_id: str) -> None:
        self.spans.responded(response_id)

    def grouped(self, how: str) -> None:
        """How the request's session was found: a header's name, "prompt_cache_key" or "history"."""
        self.spans.grouped(how)

    def asked(self, attributes: dict, texts: dict | None = None) -> None:
        """What the request asked for that this server records and does not act on (the model name a
        Gemini path gave, its response schema, its thinking budget): on the request's span. `texts`:
        what is recorded only with trace content."""
        self.spans.asked(attributes, texts)

    def compacted(self, how: str, summary_id: str | None, replaced: int) -> None:
        """This request was a compaction (how: trigger, compact, threshold; client: the client's own, whose
        summary it keeps): its summary replaces `replaced` items."""
        self.spans.compacted(how, summary_id, replaced)
        self.metrics.compacted(how)

    def expanded(self, compactions: int) -> None:
        """This request's input held compaction items, each rendered as its summary."""
        self.spans.expanded(compactions)

    def forked(self, original: dict, index: int, replacement: list[int]) -> None:
        self.spans.forked(original, index, replacement)

    def fail(self, status: int, error_type: str) -> None:
        """The request ended in an error: its HTTP status (499: the client left) and what it was."""
        self.status, self.error_type = status, error_type

    def stream_failed(self, code: str) -> None:
        """An error after the status line went out: the status stays, the span says what broke."""
        self.error_type = code

    def end(self) -> None:
        self.spans.end(self.status, self.error_type)
        self.metrics.end(self.status, self.error_type)
