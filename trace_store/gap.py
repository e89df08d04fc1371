"""The training–inference gap of a rollout, token by token: the trainer's logprob of each token the
model wrote (rollouts.py, uploaded after the trainer's own forward pass) against the logprob the
serving backend recorded when it sampled it.

Per token, the log-ratio log π_trainer(x) − log π_inference(x), and the importance ratio r = exp of
it, which truncated importance sampling caps (at 2, by default: TIS's C). Per step and per rollout:
the k3 estimate of KL(π_inference ‖ π_trainer) from the sampled tokens (mean of r − 1 − log r, never
negative, 0 only where the two agree), the share of tokens whose ratio passes the cap, and the worst
tokens (largest |log-ratio|).
"""

from __future__ import annotations

import math

DEFAULT_CAP = 2.0
WORST = 10  # tokens listed as the worst of a rollout


def figures(inference: list[float], trainer: list[float], cap: float = DEFAULT_CAP) -> dict:
    """k3, the share past `cap` and the mean |log-ratio| of tokens with both logprobs. A k3 past a
    float's range is `kl_k3` null with `kl_k3_overflow` true: JSON has no infinity, and a bare null
    would read as "no tokens"."""
    ratios = [t - i for i, t in zip(inference, trainer) if i is not None and t is not None]
    if not ratios:
        return {"tokens": 0, "kl_k3": None, "kl_k3_overflow": False, "past_cap": None, "mean_abs_log_ratio": None}
    n = len(ratios)
    k3 = sum(_k3_term(r, n) for r in ratios)
    overflow = not math.isfinite(k3)
    past = sum(1 for r in ratios if r > math.log(cap)) / n
    return {"tokens": n, "kl_k3": None if overflow else k3, "kl_k3_overflow": overflow, "past_cap": past,
            "mean_abs_log_ratio": sum(abs(r) / n for r in ratios)}


def _k3_term(r: float, n: int) -> float:
    """(e^r − 1 − r) / n, divided before it is summed: e^r alone passes a float's range from r ≈ 709.8."""
    if r < 700:
        return (math.expm1(r) - r) / n
    scaled = r - math.log(n)
    return (math.exp(scaled) if scaled < 709.78 else math.inf) - (1 + r) / n


def rollout_gap(queries, key: str, trainer: dict[str, tuple[list[float], str | None]],
                cap: float = DEFAULT_CAP) -> dict | None:
    """A rollout's gap, step by step (each step's log-ratios, for the viewer's heat map) and whole,
    from the store's steps and tokens and the trainer's logprobs by trace id. None: no such session."""
    session = queries.session(key)
    if session is None:
        return None
    steps, everything, worst = [], ([], []), []
    for number, step in enumerate(session["steps"], 1):
        trace_id = step["trace_id"]
        if trace_id not in trainer:
            continue
        values, version = trainer[trace_id]
        found = queries.tokens(trace_id) or {"tokens": []}
        tokens = found["tokens"]
        inference = [t.get("logprob") for t in tokens]
        log_ratios = [None if i is None or t is None else t - i for i, t in zip(inference, values)]
        steps.append({"step": number, "trace_id": trace_id, "weight_version": version, "log_ratios": log_ratios,
                      **figures(inference, values, cap)})
        everything[0].extend(inference)
        everything[1].extend(values)
        worst += [(abs(r), number, trace_id, index, tokens[index], r) for index, r in enumerate(log_ratios)
                  if r is not None]
    worst.sort(key=lambda w: -w[0])
    return {"rollout": key, "cap": cap, **figures(*everything, cap), "steps": steps,
            "worst": [{"step": n, "trace_id": t, "index": i, "id": token.get("id"),
                       "text": token.get("text", token.get("piece")), "log_ratio": r,
                       "inference_logprob": token.get("logprob"), "trainer_logprob": r + token.get("logprob")}
                      for _, n, t, i, token, r in worst[:WORST]]}
