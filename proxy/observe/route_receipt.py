"""The routing receipt (backends/vllm/routing.py's Route.receipt) as the decode span's attributes: where a request
went and why, each server's price (backends/vllm/cost.py), and, once it is answered, how far the prediction was:
cached tokens against predicted, time to first token against expected."""

from __future__ import annotations

from looptrace.common import attributes as attr

# The receipt's fields and the attributes they become.
FIELDS = (("policy", attr.ROUTE_POLICY), ("reason", attr.ROUTE_REASON), ("score", attr.ROUTE_SCORE),
          ("load", attr.ROUTE_LOAD), ("predicted_cached_tokens", attr.ROUTE_PREDICTED_CACHED_TOKENS),
          ("index", attr.ROUTE_INDEX), ("expected_ttft", attr.ROUTE_EXPECTED_TTFT),
          ("prefill_tokens", attr.ROUTE_PREFILL_TOKENS), ("queued_tokens", attr.ROUTE_QUEUED_TOKENS),
          ("others_waiting", attr.ROUTE_OTHERS_WAITING), ("prefill_rate", attr.ROUTE_PREFILL_RATE),
          ("decoding", attr.ROUTE_DECODING), ("decode_seconds", attr.ROUTE_DECODE_SECONDS),
          ("overhead_seconds", attr.ROUTE_OVERHEAD_SECONDS), ("spread_seconds", attr.ROUTE_SPREAD_SECONDS),
          ("met_queue_seconds", attr.ROUTE_MET_QUEUE_SECONDS), ("kept_conversations", attr.ROUTE_KEPT_CONVERSATIONS),
          ("runner_up", attr.ROUTE_RUNNER_UP),
          ("runner_up_score", attr.ROUTE_RUNNER_UP_SCORE), ("runner_up_load", attr.ROUTE_RUNNER_UP_LOAD),
          ("runner_up_predicted_cached_tokens", attr.ROUTE_RUNNER_UP_PREDICTED_CACHED_TOKENS),
          ("runner_up_expected_ttft", attr.ROUTE_RUNNER_UP_EXPECTED_TTFT),
          ("runner_up_prefill_tokens", attr.ROUTE_RUNNER_UP_PREFILL_TOKENS),
          ("runner_up_queued_tokens", attr.ROUTE_RUNNER_UP_QUEUED_TOKENS),
          ("runner_up_spread_seconds", attr.ROUTE_RUNNER_UP_SPREAD_SECONDS),
          ("runner_up_met_queue_seconds", attr.ROUTE_RUNNER_UP_MET_QUEUE_SECONDS),
          ("runner_up_kept_conversations", attr.ROUTE_RUNNER_UP_KEPT_CONVERSATIONS))


def chosen(receipt: dict) -> dict:
    """The attributes of the choice, set when the request goes out."""
    return {key: receipt[name] for name, key in FIELDS if name in receipt}


def answered(receipt: dict, cached: int, ttft: float | None) -> dict:
    """The receipt's other half, set once the server answered: what it said it had cached (its `cached_tokens`),
    and the time to first token it took (sent → first token, as the backend saw it)."""
    out = {attr.ROUTE_CACHED_TOKENS: cached, attr.ROUTE_PREDICTION_ERROR: cached - receipt["predicted_cached_tokens"]}
    if ttft is not None and "expected_ttft" in receipt:
        out.update({attr.ROUTE_TTFT: round(ttft, 6), attr.ROUTE_TTFT_ERROR: round(ttft - receipt["expected_ttft"], 6)})
    return out
