"""The routing receipt (backends/vllm/routing/policies.py's Route.receipt) as the decode span's attributes: where a
request went and why, each server's price (backends/vllm/routing/cost.py), and, once it is answered, how far the
prediction was: cached tokens against predicted, time to first token against expected."""

from __future__ import annotations

from looptrace.common import attributes as attr

def chosen(receipt: dict) -> dict:
    """The attributes of the choice (common/attributes.py's ROUTE_RECEIPT), set when the request goes out."""
    return {key: receipt[name] for name, key, _ in attr.ROUTE_RECEIPT if name is not None and name in receipt}


def answered(receipt: dict, cached: int, ttft: float | None) -> dict:
    """The receipt's other half, set once the server answered: what it said it had cached (its `cached_tokens`),
    and the time to first token it took (sent → first token, as the backend saw it)."""
    out = {attr.ROUTE_CACHED_TOKENS: cached, attr.ROUTE_PREDICTION_ERROR: cached - receipt["predicted_cached_tokens"]}
    if ttft is not None and "expected_ttft" in receipt:
        out.update({attr.ROUTE_TTFT: round(ttft, 6), attr.ROUTE_TTFT_ERROR: round(ttft - receipt["expected_ttft"], 6)})
    return out
