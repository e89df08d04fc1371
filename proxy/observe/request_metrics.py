"""One request's metrics, fed by the Generation it watches (an Observer: engine/observer.py).

The generation's series are labelled by the model the client asked for (checked by then: a request
for another model is refused before it generates); the request's own, `looptrace_requests` and
`looptrace_request_duration_seconds`, by the served model once it was checked, else "unknown", so
that no string a client sends becomes a label value. Histograms carry the trace's id as an
exemplar, when the trace is kept somewhere.

The per-token path (`token`) is one append; time to first token is observed at the first token,
inter-token gaps and token counts once per group of GROUP tokens (the decode span's token events
are grouped the same way), where the work is done in bulk.
"""

from __future__ import annotations

import time
from operator import sub

from looptrace.backends.base import DecodeRequest
from looptrace.backends.events import PrefillEvent, TokenEvent, UpstreamEvent
from looptrace.families.deltas import ToolCallDelta, UnparsedCallDelta
from looptrace.trace_store.tokens import GROUP

from ..engine.generation import Generation
from ..engine.observer import Observer
from .metrics import Metrics, observe_all

NS_PER_SECOND = 1_000_000_000


class RequestMetrics(Observer):
    def __init__(self, metrics: Metrics, *, endpoint: str, trace_id: str | None) -> None:
        self.metrics = metrics
        self.endpoint = endpoint
        self.model = ""  # the model asked for: the label of the generation's series
        self._label = "unknown"  # the `model` label of the request's own series: the served model, once checked
        self.started = time.perf_counter()
        self._started_ns = time.time_ns()  # on the clock the engine stamps tokens with
        self._exemplar = {"trace_id": trace_id} if trace_id else None
        self._server: str | None = None  # the vLLM server the tokens come from, once the backend says
        self._receipt: dict | None = None  # why that server (the routing's receipt)
        self._prefill: PrefillEvent | None = None  # until its cached tokens are counted
        self._ttft: float | None = None  # the backend's time to first token (its prefill event's)
        # The children the per-group counts go to, labelled once: inter-token latency (from submission),
        # generated tokens by channel, and by the vLLM server that generated them (once it is known).
        self._itl = None
        self._by_channel: dict[str, object] = {}
        self._upstream_tokens = None
        self._max_itl_ns = 0  # the slowest gap so far
        # (arrival, channel) of each token since the last group was counted, and the arrival of the
        # last token counted before them (None: none yet).
        self._pending: list[tuple[int, str]] = []
        self._last_ns: int | None = None
        # Until the first token, `token` is `_first_token`, which also times the wait for it: the
        # per-token path asks no question that is answered once.
        self.token = self._first_token

    def requested(self, model: str) -> None:
        self.model = model

    def checked(self) -> None:
        """The model asked for is the one served: from here on it labels the request's own series."""
        self._label = self.model

    def compacted(self, how: str) -> None:
        self.metrics.compactions.labels(self.model, how).inc()

    # -- the generation --

    def rendered(self, generation: Generation, started_ns: int, ended_ns: int, content: bool = True) -> None:
        runs, model, rendered = generation.media_runs, self.model, generation.rendered
        metrics = self.metrics
        metrics.render_duration.labels(model).observe((ended_ns - started_ns) / NS_PER_SECOND, self._exemplar)
        if rendered is not None:
            reused = rendered.reused_ids
            metrics.render_tokens.labels(model, "reused").inc(reused)
            metrics.render_tokens.labels(model, "encoded").inc(len(generation.prompt_ids) - reused)
            if rendered.checked is not None:
                metrics.render_checks.labels(model, "same" if rendered.checked else "differed").inc()
            if rendered.rendered_how:
                metrics.render_windows.labels(model, rendered.rendered_how).inc()
            if rendered.render_checked is not None:  # the series exists from the first check, 0 while none differ
                metrics.render_drift.labels(model).inc(rendered.render_checked is False)
        if generation.continuity.kind is not None:
            metrics.token_continuity.labels(model, generation.continuity.kind).inc()
        for n, part in enumerate(generation.media_parts):
            self.metrics.media_items.labels(model, part.kind).inc()
            self.metrics.media_tokens.labels(model, part.kind).inc(runs[n][2] if n < len(runs) else 0)

    def submitted(self, generation: Generation, decode: DecodeRequest) -> dict[str, str]:
        self._itl = self.metrics.itl.labels(self.model)
        return {}

    def upstream(self, event: UpstreamEvent) -> None:
        server = self._server = event["server"]
        metrics = self.metrics
        metrics.upstream_requests.labels(self.model, server).inc()
        self._upstream_tokens = metrics.upstream_tokens.labels(self.model, server)
        receipt = self._receipt = event.get("receipt")
        if event["moved_from"]:
            why = receipt["reason"] if receipt else "retry"
            metrics.upstream_moved.labels(self.model, event["moved_from"], why).inc()
        if receipt:
            metrics.upstream_routed.labels(self.model, server, receipt["reason"]).inc()
        retry = event["retry_after"]
        if retry:
            metrics.upstream_errors.labels(self.model, retry["server"], retry["code"]).inc()

    def prefill(self, event: PrefillEvent) -> None:
        self._prefill, self._ttft = event, event["seconds"]
        self.metrics.prompt_tokens.labels(self.model).inc(event["prompt_tokens"])

    def _count_cached(self, cached: int | None) -> None:
        """Once per prefill, when its cached tokens are known (a vLLM server says only at the end)."""
        if self._prefill is None:
            return
        self._prefill = None
        if cached:
            self.metrics.cached_tokens.labels(self.model).inc(cached)

    def token(self, event: TokenEvent, channel: str, now_ns: int) -> None:
        pending = self._pending
        pending.append((now_ns, channel))
        if len(pending) >= GROUP:
            self._flush_tokens()

    def _first_token(self, event: TokenEvent, channel: str, now_ns: int) -> None:
        del self.token  # the class's own from now on
        seconds = (now_ns - self._started_ns) / NS_PER_SECOND
        self.metrics.ttft.labels(self.model, self.endpoint).observe(seconds, self._exemplar)
        if self._server is not None:
            self.metrics.upstream_ttft.labels(self.model, self._server).observe(seconds, self._exemplar)
        self.token(event, channel, now_ns)

    def _flush_tokens(self) -> None:
        pending = self._pending
        if not pending:
            return
        self._pending = []
        times, channels = zip(*pending)
        arrivals = times if self._last_ns is None else (self._last_ns, *times)
        self._last_ns = times[-1]
        gaps = list(map(sub, arrivals[1:], arrivals))  # between consecutive tokens, in nanoseconds
        itl = self._itl
        slowest = max(gaps, default=0)
        if slowest > self._max_itl_ns:  # an exemplar on each new slowest gap points slow buckets at this trace
            self._max_itl_ns = slowest
            gaps.remove(slowest)
            itl.observe(slowest / NS_PER_SECOND, self._exemplar)
        observe_all(itl, gaps, NS_PER_SECOND)
        by_channel = self._by_channel
        for channel in set(channels):
            child = by_channel.get(channel)
            if child is None:
                child = by_channel[channel] = self.metrics.generation_tokens.labels(self.model, channel)
            child.inc(channels.count(channel))
        if self._upstream_tokens is not None:
            self._upstream_tokens.inc(len(pending))

    def _count_route(self, prompt: int, cached: int) -> None:
        """The server's prefix-cache hits, and how far the routing's prediction of them was off."""
        metrics, labels, predicted = self.metrics, (self.model, self._server), self._receipt["predicted_cached_tokens"]
        metrics.upstream_prompt_tokens.labels(*labels).inc(prompt)
        metrics.upstream_cached_tokens.labels(*labels).inc(cached)
        metrics.upstream_predicted_cached_tokens.labels(*labels).inc(predicted)
        metrics.upstream_prediction_error.labels(*labels).observe(abs(cached - predicted) / max(prompt, 1))
        expected = self._receipt.get("expected_ttft")
        if expected is not None and self._ttft is not None:  # how far the price was from the wait
            metrics.upstream_ttft_prediction_error.labels(*labels).observe(abs(self._ttft - expected), self._exemplar)

    def tool_call(self, delta: ToolCallDelta) -> None:
        self.metrics.tool_calls.labels(self.model, delta["outcome"]).inc()

    def unparsed_call(self, delta: UnparsedCallDelta) -> None:
        self.metrics.tool_calls.labels(self.model, "unparsed").inc()

    def finished(self, generation: Generation) -> None:
        done = generation.done_event or {}
        self._count_cached(generation.cached_tokens)
        if self._receipt is not None:
            self._count_route(generation.prompt_tokens, generation.cached_tokens)
        rate = done.get("tokens_per_second", 0.0)
        if rate:
            self.metrics.decode_rate.labels(self.model).observe(rate, self._exemplar)
        if done.get("drafted"):
            method = done.get("draft_method") or "unknown"
            self.metrics.spec_draft_tokens.labels(self.model, method).inc(done["drafted"])
            self.metrics.spec_accepted_tokens.labels(self.model, method).inc(done["accepted"])
            self.metrics.spec_drafts.labels(self.model, method).inc(done["drafts"])
        self._flush_tokens()

    # -- the request's end --

    def end(self, status: int, error_type: str | None) -> None:
        """The request ended with this HTTP status (499: the client left), and this error, if one."""
        if self._prefill is not None:  # the generation never finished: cached tokens as far as they are known
            self._count_cached(self._prefill["cached_tokens"])
        if error_type and self._server is not None and error_type.startswith("upstream_"):  # the server's failure
            self.metrics.upstream_errors.labels(self.model, self._server, error_type).inc()
        self._flush_tokens()
        self.__dict__.pop("token", None)  # a request that never got a token: `_first_token` held `self`
        seconds = time.perf_counter() - self.started
        self.metrics.requests.labels(self._label, self.endpoint, str(status)).inc()
        self.metrics.duration.labels(self._label, self.endpoint).observe(seconds, self._exemplar)
