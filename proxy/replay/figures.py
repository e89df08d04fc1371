"""What a replay finds, step by step and for the session.

Forced mode (the recorded answer read by the target, teacher forced): a token agrees when the
target's greedy choice there is the recording model's own greedy choice (the top of its recorded
five; for a greedy recording, the token itself). For a sampled recording this asks "would the two
models have chosen alike", not "would the target have drawn the same sample". The first divergence
is the first token where they differ; the means are the recorded tokens' logprobs under each model.
Tokens of the tool calls (the tool_call channel: name, arguments and their markup) are counted
apart as well, since that is where an agent's actions are.

Step mode (each prompt decoded afresh by the target): tokens agree up to the first one the target
wrote differently; the step is acted alike when the target made the same tool calls (names,
arguments compared as JSON, outcomes, in order) and stopped for the same reason.

The session's agreement: forced, the share of all tokens that agree; step, the share of steps acted alike.
"""

from __future__ import annotations

import json
import math

from looptrace.trace_store.recorded_sessions import Recorded

TOOL_CALL = "tool_call"  # the channel a tool call's tokens fall in (families/base.py's TOOL_CALL)


def _mean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None and math.isfinite(v)]
    return sum(values) / len(values) if values else None


def _greedy_of(token: dict) -> int:
    """The recording model's greedy choice at a token: the top of its five, else the token itself."""
    top = token.get("top_ids") or []
    return top[0] if top else token["id"]


def forced(recorded: Recorded, scores: list[dict]) -> dict:
    tokens = recorded.tokens
    agree = [s["greedy_id"] == _greedy_of(t) for t, s in zip(tokens, scores)]
    first = next((i for i, same in enumerate(agree) if not same), None)
    calls = [i for i, t in enumerate(tokens) if t.get("channel") == TOOL_CALL]
    diffs = [abs(s["logprob"] - t["logprob"]) for t, s in zip(tokens, scores)
             if t.get("logprob") is not None and math.isfinite(t["logprob"])]
    return {
        "tokens": len(tokens), "agreeing": sum(agree), "first_divergence": first,
        "mean_logprob_recorded": _mean([t.get("logprob") for t in tokens]),
        "mean_logprob_target": _mean([s["logprob"] for s in scores]),
        "max_logprob_difference": max(diffs) if diffs else None,
        "tool_call_tokens": len(calls), "tool_call_agreeing": sum(agree[i] for i in calls),
        "mean_logprob_recorded_tool_calls": _mean([tokens[i].get("logprob") for i in calls]),
        "mean_logprob_target_tool_calls": _mean([scores[i]["logprob"] for i in calls]),
        "divergence": None if first is None else {
            "recorded_id": tokens[first]["id"], "recorded_piece": tokens[first].get("piece"),
            "recording_greedy_id": _greedy_of(tokens[first]), "target_greedy_id": scores[first]["greedy_id"],
            "target_greedy_piece": scores[first].get("greedy_piece")},
    }


def same_calls(recorded: list[dict], replayed: list[dict]) -> bool:
    return [_call_key(c) for c in recorded] == [_call_key(c) for c in replayed]


def _call_key(call: dict) -> tuple:
    if call.get("outcome") == "unparsed":
        return ("unparsed", call.get("raw"))
    try:
        arguments = json.loads(call.get("arguments") or "null")
    except json.JSONDecodeError:
        arguments = call.get("arguments")
    return (call.get("name"), json.dumps(arguments, sort_keys=True), call.get("outcome"))


def step(recorded: Recorded, generated: dict) -> dict:
    ids = [t["id"] for t in recorded.tokens]
    new = [t["id"] for t in generated["tokens"]]
    agreeing = next((i for i, (a, b) in enumerate(zip(ids, new)) if a != b), min(len(ids), len(new)))
    identical = ids == new
    calls_equal = same_calls(recorded.calls, generated["tool_calls"])
    return {
        "tokens": len(ids), "generated_tokens": len(new), "agreeing": agreeing,
        "first_divergence": None if identical else agreeing,
        "mean_logprob_recorded": _mean([t.get("logprob") for t in recorded.tokens]),
        "mean_logprob_target": _mean([t["logprob"] for t in generated["tokens"]]),
        "tool_calls_equal": calls_equal,
        "finish_reason_recorded": recorded.finish_reason, "finish_reason_target": generated["finish_reason"],
        "acted_alike": calls_equal and recorded.finish_reason == generated["finish_reason"],
        "tool_calls_recorded": [_shown(c) for c in recorded.calls],
        "tool_calls_target": [_shown(c) for c in generated["tool_calls"]],
    }


def _shown(call: dict) -> dict:
    return {k: call[k] for k in ("name", "arguments", "outcome", "raw") if call.get(k) is not None}


def session(mode: str, steps: list[dict]) -> dict:
    """The session's figures over the steps that ran (skipped ones have no `tokens`)."""
    ran = [s for s in steps if "tokens" in s]
    if mode == "forced":
        total = sum(s["tokens"] for s in ran)
        agreement = sum(s["agreeing"] for s in ran) / total if total else None
        diverged = next((s for s in ran if s["first_divergence"] is not None), None)
        first = {"step": diverged["step"], "token": diverged["first_divergence"]} if diverged else None
        return {"agreement": agreement, "tokens": total, "agreeing": sum(s["agreeing"] for s in ran),
                "steps_agreeing": sum(s["first_divergence"] is None for s in ran), "first_divergence": first}
    alike = [s for s in ran if s["acted_alike"]]
    different = next((s["step"] for s in ran if not s["acted_alike"]), None)
    diverged = next((s for s in ran if s["first_divergence"] is not None), None)
    return {"agreement": len(alike) / len(ran) if ran else None, "steps_agreeing": len(alike),
            "first_different_step": different,
            "first_divergence": {"step": diverged["step"], "token": diverged["first_divergence"]} if diverged else None}
