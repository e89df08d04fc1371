"""Prometheus metrics, prefix `looptrace_`, served on GET /metrics; names from common/attributes.py.

Histograms carry `trace_id` exemplars, which only the OpenMetrics exposition shows: /metrics
answers in OpenMetrics when the scraper asks for it (Prometheus does, with exemplar storage on).

Under `looptrace serve --workers N` every worker runs prometheus_client's multiprocess mode (the
parent sets PROMETHEUS_MULTIPROC_DIR, which prometheus_client reads when imported, as under
gunicorn): each worker writes its values to files of its own, and whichever worker answers a scrape
sums every worker's files, so /metrics on the shared port is the same whole, each series once.
What that mode cannot do, and what is done instead:

- Gauges read by a function at scrape time cannot be read across processes: each worker copies
  its own into its file every second (and before it answers a scrape), and the gauge sums the live
  workers' values (`livesum`; `livemax` for a vLLM server's up/down).
- Its exposition has no exemplars (the files hold numbers only): the worker that answers adds its
  own, its last exemplar of each bucket, to the summed buckets. An exemplar is an example of its
  bucket, and the traces it names are in the store every worker writes to.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import threading
from bisect import bisect_right

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder
from prometheus_client.multiprocess import MultiProcessCollector

from looptrace.backends.speculative.config import METHODS
from looptrace.common import attributes as attr

log = logging.getLogger("looptrace")

# Below vLLM's lowest bucket too: a small model on a GPU produces a token every few milliseconds.
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
               0.5, 0.75, 1.0, 2.5)
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0)
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0, 600.0)
RENDER_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0)
MOVE_REASONS = ("faster", "least_loaded", "home", "retry", "only")  # why a conversation leaves a server (vllm/routing/policies.py)
ERROR_BUCKETS = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)  # a prediction's error, as a share of the prompt
RATE_BUCKETS = (1, 2, 5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 500, 750, 1000, 1500, 2000)


SAMPLE_SECONDS = 1.0  # how often a worker copies its function-read gauges into its file


class _KeptExemplar:
    """A histogram bucket's value that keeps its last exemplar in this process: a multiprocess value
    drops exemplars (prometheus_client has none in that mode)."""

    __slots__ = ("value", "exemplar")

    def __init__(self, value) -> None:
        self.value, self.exemplar = value, None

    def inc(self, amount: float) -> None:
        self.value.inc(amount)

    def set(self, value: float, timestamp: float | None = None) -> None:
        self.value.set(value, timestamp)

    def get(self) -> float:
        return self.value.get()

    def set_exemplar(self, exemplar) -> None:
        self.exemplar = exemplar

    def get_exemplar(self):
        return self.exemplar


class _ExemplarHistogram(Histogram):
    def _metric_init(self) -> None:  # prometheus_client's hook that makes a child's buckets
        super()._metric_init()
        self._buckets = [_KeptExemplar(bucket) for bucket in self._buckets]


class Metrics:
    def _render_metrics(self, histogram) -> None:
        """Rendering: what a turn's prompt cost, and how much of it was taken from the turn before."""
        r = self.registry
        self.render_tokens = Counter(attr.METRIC_RENDER_TOKENS, "Prompt tokens rendered, by how: reused (taken from "
                                     "the conversation's previous prompt) or encoded.", ["model", "how"], registry=r)
        self.render_checks = Counter(attr.METRIC_RENDER_CHECKS, "Prompts encoded from the conversation's previous one "
                                     "and checked against a whole encoding, by result (same, differed).",
                                     ["model", "result"], registry=r)
        self.render_windows = Counter(attr.METRIC_RENDER_WINDOWS, "A conversation turn's chat template text, by how: "
                                      "window (rendered from what the turn adds), whole, fallback (a check refused "
                                      "the window).", ["model", "how"], registry=r)
        self.render_drift = Counter(attr.METRIC_RENDER_DRIFT, "Windowed renderings a sampled whole rendering "
                                    "contradicted (the whole one was used).", ["model"], registry=r)
        self.token_continuity = Counter(attr.METRIC_TOKEN_CONTINUITY, "Turns whose prompt continues the "
                                        "conversation's last, by how (class): clean, realign, fork, kept "
                                        "(--token-continuity).", ["model", "class"], registry=r)
        self.render_duration = histogram(attr.METRIC_RENDER_DURATION, "Rendering a prompt with the chat template and "
                                         "tokenizing it.", ["model"], buckets=RENDER_BUCKETS, registry=r)

    def _compaction_metrics(self) -> None:
        """Compactions (api/openai/responses/compaction/plan.py): the summaries written, and the items that named them."""
        r = self.registry
        self.compactions = Counter(attr.METRIC_COMPACTIONS, "Summaries the model wrote for compactions, by how they "
                                   "were asked for (trigger, compact, threshold; client: the client's own).", ["model", "how"], registry=r)
        self.compaction_items = Counter(attr.METRIC_COMPACTION_ITEMS, "Compaction items in requests, by result: "
                                        "expanded, or refused as malformed, tampered or unknown (expired, or "
                                        "another server's).", ["result"], registry=r)

    def _media_metrics(self) -> None:
        """Attached items (images, audio, video) and the prompt tokens they became."""
        r = self.registry
        self.media_items = Counter(attr.METRIC_MEDIA_ITEMS, "Attached items that reached the model, by kind "
                                   "(image, audio, video).", ["model", "kind"], registry=r)
        self.media_tokens = Counter(attr.METRIC_MEDIA_TOKENS, "Prompt tokens that attached items became, by kind.",
                                    ["model", "kind"], registry=r)

    def _key_metrics(self) -> None:
        """Each API key's use and its budgets' refusals (api/budgets.py), by `key`: a key's name, which the
        operator chose (`looptrace keys create`), never a client's string."""
        r = self.registry
        self.key_requests = Counter(attr.METRIC_KEY_REQUESTS, "Generating requests each API key sent, refused "
                                    "ones included.", ["key"], registry=r)
        self.key_tokens = Counter(attr.METRIC_KEY_TOKENS, "Prompt and generated tokens of each API key's "
                                  "requests.", ["key"], registry=r)
        self.key_refused = Counter(attr.METRIC_KEY_REFUSED, "Each API key's requests refused by its budget (429), by "
                                   "reason: requests (per minute) or tokens (per day).", ["key", "reason"], registry=r)

    def _routing_metrics(self, histogram) -> None:
        """Routing among vLLM servers: why each request went where it did, and its prefix-cache hits there."""
        r = self.registry
        self.upstream_routed = Counter(attr.METRIC_UPSTREAM_ROUTED, "Requests routed to each vLLM server, by why "
                                       "(home, faster, least_loaded, retry, only).",
                                       ["model", "server", "reason"], registry=r)
        self.upstream_prompt_tokens = Counter(attr.METRIC_UPSTREAM_PROMPT_TOKENS, "Prompt tokens of the requests each "
                                              "vLLM server finished.", ["model", "server"], registry=r)
        self.upstream_cached_tokens = Counter(attr.METRIC_UPSTREAM_CACHED_TOKENS, "Of those, the tokens it found in "
                                              "its prefix cache (its cached_tokens).", ["model", "server"], registry=r)
        self.upstream_predicted_cached_tokens = Counter(attr.METRIC_UPSTREAM_PREDICTED_CACHED_TOKENS, "Of those, "
                                                        "the tokens routing predicted it would find.",
                                                        ["model", "server"], registry=r)
        self.upstream_prediction_error = histogram(attr.METRIC_UPSTREAM_PREDICTION_ERROR, "How far each request's "
                                                   "predicted cached tokens were from the server's, as a share of its "
                                                   "prompt.", ["model", "server"], buckets=ERROR_BUCKETS, registry=r)
        self.upstream_ttft_prediction_error = histogram(attr.METRIC_UPSTREAM_TTFT_PREDICTION_ERROR, "How far each "
                                                        "request's time to first token was from the routing's "
                                                        "expected one (|taken − expected|).", ["model", "server"],
                                                        buckets=TTFT_BUCKETS, registry=r)
        self.upstream_kv_events_trusted = Gauge(attr.METRIC_UPSTREAM_KV_EVENTS_TRUSTED, "1 while routing reads what a "
                                                "vLLM server holds from its KV events; 0 while it estimates (no events, "
                                                "a silent or unreadable publisher).", ["model", "server"], registry=r,
                                                multiprocess_mode="livemin")

    def __init__(self) -> None:
        # The same switch prometheus_client read when it was imported: values in per-process files.
        self.multiprocess_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None
        self.registry = CollectorRegistry(auto_describe=True)
        self._sampled: list[tuple[object, object]] = []  # (gauge child, read) copied every second
        self._sampling: threading.Event | None = None
        histogram = _ExemplarHistogram if self.multiprocess_dir else Histogram
        r = self.registry
        self.requests = Counter(attr.METRIC_REQUESTS, "Requests finished, by endpoint and HTTP status.",
                                ["model", "endpoint", "status"], registry=r)
        self.prompt_tokens = Counter(attr.METRIC_PROMPT_TOKENS, "Prompt tokens read.", ["model"], registry=r)
        self.cached_tokens = Counter(attr.METRIC_PROMPT_CACHED_TOKENS,
                                     "Prompt tokens served from a prefix cache.", ["model"], registry=r)
        self._render_metrics(histogram)
        self.generation_tokens = Counter(attr.METRIC_GENERATION_TOKENS,
                                         "Tokens generated, by channel (thought, content, tool_call).",
                                         ["model", "channel"], registry=r)
        self.ttft = histogram(attr.METRIC_TIME_TO_FIRST_TOKEN,
                              "From the request's arrival to its first generated token.", ["model", "endpoint"],
                              buckets=TTFT_BUCKETS, registry=r)
        self.itl = histogram(attr.METRIC_INTER_TOKEN_LATENCY, "Time between consecutive generated tokens.",
                             ["model"], buckets=ITL_BUCKETS, registry=r)
        self.duration = histogram(attr.METRIC_REQUEST_DURATION, "From a request's arrival to its end.",
                                  ["model", "endpoint"], buckets=DURATION_BUCKETS, registry=r)
        self.decode_rate = histogram(attr.METRIC_DECODE_TOKENS_PER_SECOND,
                                     "Decode speed of each request (tokens after the first ÷ their time).",
                                     ["model"], buckets=RATE_BUCKETS, registry=r)
        # Speculative decoding by `method` (ngram, suffix, draft_model, mtp: backends/speculative/config.py).
        self.spec_draft_tokens = Counter(attr.METRIC_SPEC_DECODE_DRAFT_TOKENS, "Tokens proposed by drafting, by "
                                         "method.", ["model", "method"], registry=r)
        self.spec_accepted_tokens = Counter(attr.METRIC_SPEC_DECODE_ACCEPTED_TOKENS,
                                            "Draft tokens the target model accepted, by method.", ["model", "method"],
                                            registry=r)
        self.spec_drafts = Counter(attr.METRIC_SPEC_DECODE_DRAFTS, "Draft proposals made, by method.",
                                   ["model", "method"], registry=r)
        self._media_metrics()
        self.tool_calls = Counter(attr.METRIC_TOOL_CALLS, "Tool calls the model made, by outcome "
                                  "(valid, invalid_args, unknown_tool, unparsed).", ["model", "outcome"], registry=r)
        self._compaction_metrics()
        self._key_metrics()
        # Each vLLM server behind --backend vllm, by `server` ("host:port", from --vllm-url: never a
        # client's string). The families above stay whole-model, so their panels need no sum.
        self.upstream_requests = Counter(attr.METRIC_UPSTREAM_REQUESTS, "Requests sent to each vLLM server, "
                                         "retries included.", ["model", "server"], registry=r)
        self.upstream_errors = Counter(attr.METRIC_UPSTREAM_ERRORS, "Requests a vLLM server failed, by error "
                                       "code (retried or not).", ["model", "server", "code"], registry=r)
        self.upstream_tokens = Counter(attr.METRIC_UPSTREAM_GENERATION_TOKENS, "Tokens each vLLM server generated.",
                                       ["model", "server"], registry=r)
        self.upstream_ttft = histogram(attr.METRIC_UPSTREAM_TIME_TO_FIRST_TOKEN,
                                       "From the request's arrival to its first token, by the vLLM server that "
                                       "produced it.", ["model", "server"], buckets=TTFT_BUCKETS, registry=r)
        self.upstream_moved = Counter(attr.METRIC_UPSTREAM_SESSIONS_MOVED, "Conversations whose request went to "
                                      "another server than their last one, by the server they left and the routing's "
                                      "reason.", ["model", "server", "reason"], registry=r)
        self._routing_metrics(histogram)
        # Each gauge's multiprocess_mode says how workers' values add up (ignored in one process).
        self.upstream_up = Gauge(attr.METRIC_UPSTREAM_UP, "1 while a vLLM server takes requests (connected, "
                                 "answering its probes), else 0.", ["model", "server"], registry=r,
                                 multiprocess_mode="livemax")
        self.upstream_running = Gauge(attr.METRIC_UPSTREAM_REQUESTS_RUNNING, "Requests streaming from each vLLM "
                                      "server.", ["model", "server"], registry=r, multiprocess_mode="livesum")
        self.running = Gauge(attr.METRIC_REQUESTS_RUNNING, "Requests being decoded.", ["model"], registry=r,
                             multiprocess_mode="livesum")
        self.waiting = Gauge(attr.METRIC_REQUESTS_WAITING, "Requests queued for the model.", ["model"], registry=r,
                             multiprocess_mode="livesum")
        self.spans_dropped = Counter(attr.METRIC_TRACE_SPANS_DROPPED, "Spans a trace sink lost (queue full or "
                                     "export failed), by sink.", ["sink"], registry=r)
        for sink in ("sqlite", "otlp"):
            self.spans_dropped.labels(sink)  # present from the start, so a rate() has a baseline
        self.trace_queue_spans = Gauge(attr.METRIC_TRACE_QUEUE_SPANS, "Finished spans waiting for a trace sink.",
                                       ["sink"], registry=r, multiprocess_mode="livesum")
        self.trace_queue_bytes = Gauge(attr.METRIC_TRACE_QUEUE_BYTES, "What the spans waiting for a trace sink "
                                       "hold (attribute and event text, estimated).", ["sink"], registry=r,
                                       multiprocess_mode="livesum")
        self._scrape = self.registry
        if self.multiprocess_dir:  # what a scrape reads: every worker's files, with this one's exemplars
            self._scrape = CollectorRegistry(auto_describe=False)
            self._scrape.register(_SummedWithOwnExemplars(self.multiprocess_dir, self.registry))

    def compaction_item(self, result: str) -> None:
        self.compaction_items.labels(result).inc()

    def watch(self, model: str, running, waiting) -> None:
        """Gauges read at scrape time, so requests do no gauge bookkeeping."""
        self._read_by(self.running.labels(model), running)
        self._read_by(self.waiting.labels(model), waiting)
        # The model's children at zero from the start (speculative decoding's under each method): a
        # dashboard's rate() of cached tokens or speculative drafts is then 0 (or 0/0), not "no data",
        # on a backend that never reports any.
        for family in (self.prompt_tokens, self.cached_tokens, self.itl, self.decode_rate):
            family.labels(model)
        for family in (self.spec_draft_tokens, self.spec_accepted_tokens, self.spec_drafts):
            for method in METHODS:
                family.labels(model, method)

    def watch_upstreams(self, model: str, upstreams) -> None:
        """Each vLLM server's state, read at scrape time; its counters at zero from the start."""
        for upstream in upstreams:
            name = upstream.name
            self._read_by(self.upstream_up.labels(model, name), lambda u=upstream: float(u.serving))
            self._read_by(self.upstream_running.labels(model, name), lambda u=upstream: u.running)
            self._read_by(self.upstream_kv_events_trusted.labels(model, name),
                          lambda u=upstream: float(u.holdings.index.source == "events"))
            for family in (self.upstream_requests, self.upstream_tokens, self.upstream_ttft,
                           self.upstream_prompt_tokens, self.upstream_cached_tokens,
                           self.upstream_predicted_cached_tokens, self.upstream_prediction_error,
                           self.upstream_ttft_prediction_error):
                family.labels(model, name)
            for reason in MOVE_REASONS:
                self.upstream_moved.labels(model, name, reason)

    def watch_queue(self, sink: str, spans, held_bytes) -> None:
        self._read_by(self.trace_queue_spans.labels(sink), spans)
        self._read_by(self.trace_queue_bytes.labels(sink), held_bytes)

    def dropped(self, sink: str, count: int) -> None:
        self.spans_dropped.labels(sink).inc(count)

    def exposition(self, accept: str | None) -> tuple[bytes, str]:
        encoder, content_type = choose_encoder(accept or "")
        self._sample()  # this worker's own gauges as of now; the others' as of their last second
        return encoder(self._scrape), content_type

    def close(self) -> None:
        if self._sampling is not None:
            self._sampling.set()

    def _read_by(self, child, read) -> None:
        """A gauge whose value `read()` gives: read at scrape time in one process; in a worker, copied
        into its file every SAMPLE_SECONDS, since another worker may answer the scrape."""
        if not self.multiprocess_dir:
            child.set_function(read)
            return
        self._sampled.append((child, read))
        if self._sampling is None:
            self._sampling = threading.Event()
            threading.Thread(target=self._sample_until_closed, name="looptrace-metrics", daemon=True).start()

    def _sample(self) -> None:
        for child, read in list(self._sampled):
            try:
                child.set(read())
            except Exception:  # noqa: BLE001 - a gauge that cannot be read now keeps its last value
                log.debug("a gauge could not be read", exc_info=True)

    def _sample_until_closed(self) -> None:
        while not self._sampling.wait(SAMPLE_SECONDS):
            self._sample()


class _SummedWithOwnExemplars:
    """Every worker's series from the multiprocess files, summed (prometheus_client's collector), with
    the exemplars this worker's histograms kept put on the buckets they belong to."""

    def __init__(self, path: str, own: CollectorRegistry) -> None:
        self._summed = MultiProcessCollector(None, path)
        self._own = own

    def collect(self):
        kept = {(sample.name, tuple(sorted(sample.labels.items()))): sample.exemplar
                for family in self._own.collect() for sample in family.samples if sample.exemplar is not None}
        for family in self._summed.collect():
            if kept:
                family.samples = [s._replace(exemplar=kept.get((s.name, tuple(sorted(s.labels.items()))), s.exemplar))
                                  for s in family.samples]
            yield family


def observe_all(histogram, values: list[float], per_second: int = 1) -> None:
    """`histogram.observe(v / per_second)` for every v, with one increment per bucket touched instead of
    one per value: the inter-token gaps of a group of tokens, where observing each was a tenth of
    tracing's per-token cost (per_second 10**9: gaps in nanoseconds, left the ints they are). Written
    against prometheus_client's histogram child (`_upper_bounds`, `_buckets`, `_sum`, unchanged for
    years); should those go, it falls back to `observe`."""
    bounds, buckets, total = (getattr(histogram, a, None) for a in ("_upper_bounds", "_buckets", "_sum"))
    if bounds is None or buckets is None or total is None:
        for value in values:
            histogram.observe(value / per_second)
        return
    # Sorted once (in C), each bucket's count is where its bound falls among the values: a value goes in
    # the first bucket whose bound is ≥ it, as observe() puts it; a bisection per bound, not per value.
    ordered, placed = sorted(values), 0
    for bucket, bound in zip(buckets, _in_units(tuple(bounds), per_second)):
        if placed == len(ordered):
            break
        upto = bisect_right(ordered, bound, placed)
        if upto > placed:
            bucket.inc(upto - placed)
            placed = upto
    total.inc(sum(values) / per_second)


@functools.lru_cache(maxsize=16)
def _in_units(bounds: tuple[float, ...], per_second: int) -> tuple[float, ...]:
    """Each bound as the largest value v with v / per_second ≤ bound: what observe() would put at or
    below it, exactly (0.3 s is 300,000,000 ns, though 300000000 * 1e-9 > 0.3)."""
    if per_second == 1:
        return bounds
    units = []
    for bound in bounds:
        if math.isinf(bound):
            units.append(bound)
            continue
        v = math.floor(bound * per_second)
        while (v + 1) / per_second <= bound:
            v += 1
        while v / per_second > bound:
            v -= 1
        units.append(v)
    return tuple(units)
