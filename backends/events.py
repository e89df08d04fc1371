"""The events every backend yields, built here and nowhere else.

Plain dicts with a `type` and the same fields from every backend, so the code that consumes them
never asks which backend produced them. Once yielded, an event is a fact: nobody writes into it.

    prefill  the prompt was read: prompt and cached tokens, seconds until the first token
    token    one generated token: its id, piece, text, whether special, and the model's own view of
             it (p, logprob, rank, the five most likely tokens, at T = 1 whatever the sampling);
             with speculative decoding, whether it was drafted (and by which method) and the draft
             accepted
    done     the generation ended: why, how many tokens, decode speed, cached prompt tokens,
             speculative decoding counts
    upstream (backends that forward, vLLM) the server an attempt goes to and why, before its tokens; a
             second one when the first server failed before the first token and another is tried

`text` is the token's share of the decoded output: the whole sequence is decoded incrementally, so
a character split across byte tokens arrives once, whole, and stop tokens contribute no text.
"""

from __future__ import annotations

import math
from typing import Literal, TypedDict

from looptrace.common.sequences import common_prefix

# A token event's type is common's: the trace store reads token events too, and imports nothing of backends.
from looptrace.common.token_event import TOP_N, TokenEvent

__all__ = ["TOP_N", "DoneEvent", "Event", "PrefillEvent", "TokenEvent", "UpstreamEvent", "done_event", "prefill_event",
           "token_event", "upstream_event"]

class PrefillEvent(TypedDict):
    type: Literal["prefill"]
    prompt_tokens: int
    cached_tokens: int | None  # None: the backend learns it only at the end (vLLM), and `done` says it
    seconds: float
    # Where the server behind expanded media itself (vLLM), the prompt length it reports, and the
    # first position where its prompt differs from the one this server rendered (None: the same).
    upstream_prompt_tokens: int | None
    upstream_differs_at: int | None


class DoneEvent(TypedDict):
    type: Literal["done"]
    finish_reason: str  # "stop" | "length" | "cancelled"
    tokens: int
    seconds: float  # from the first token to the last
    tokens_per_second: float
    cached_tokens: int  # prompt tokens served from a prefix cache
    cache_write_tokens: int  # prompt tokens whose state this request added to a prefix cache
    drafts: int  # speculative decoding: proposals, tokens proposed, tokens accepted
    drafted: int
    accepted: int
    draft_method: str  # the method that drafted them ("" without speculative decoding)
    weight_version: str | None  # the weights that sampled them, where the server says (vLLM); None elsewhere


class UpstreamEvent(TypedDict):
    type: Literal["upstream"]
    server: str  # "host:port", as the command line names it
    address: str
    port: int
    route: str
    moved_from: str | None  # the server the conversation's last request went to, when it was another
    # The attempt before this one, which failed before its first token: {"server", "code", "message"}.
    retry_after: dict | None
    # Why this server (vllm/routing/policies.py's receipt): policy, reason, predicted_cached_tokens, index (which of
    # the server's indexes predicted it: "events" or "estimate"), score, load, and the runner-up's
    # runner_up, runner_up_score, runner_up_predicted_cached_tokens, runner_up_load; None: not routed.
    receipt: dict | None


Event = PrefillEvent | TokenEvent | DoneEvent | UpstreamEvent


def prefill_event(prompt_tokens: int, cached_tokens: int | None, seconds: float, *,
                  upstream_prompt: list[int] | None = None, rendered: list[int] | None = None) -> PrefillEvent:
    differs_at = None
    if upstream_prompt is not None and rendered is not None and upstream_prompt != rendered:
        differs_at = common_prefix(upstream_prompt, rendered)
    return {"type": "prefill", "prompt_tokens": prompt_tokens, "cached_tokens": cached_tokens, "seconds": seconds,
            "upstream_prompt_tokens": len(upstream_prompt) if upstream_prompt is not None else None,
            "upstream_differs_at": differs_at}


def token_event(index: int, token_id: int, piece: str, text: str, special: bool, logprob: float, rank: int | None,
                top_ids: list[int], top_logprobs: list[float], drafted: int = 0, accepted: int = 0,
                draft_method: str = "") -> TokenEvent:
    return {"type": "token", "index": index, "id": token_id, "piece": piece, "text": text, "special": special,
            "logprob": logprob, "p": math.exp(logprob), "rank": rank, "top_ids": top_ids,
            "top_logprobs": top_logprobs, "drafted": drafted, "accepted": accepted, "draft_method": draft_method}


def done_event(finish_reason: str, tokens: int, seconds: float, *, cached_tokens: int, cache_write_tokens: int = 0,
               drafts: int = 0, drafted: int = 0, accepted: int = 0, draft_method: str = "",
               weight_version: str | None = None) -> DoneEvent:
    # The first token comes out of prefill, so the decode rate counts the ones after it.
    rate = (tokens - 1) / seconds if tokens > 1 and seconds > 0 else 0.0
    return {"type": "done", "finish_reason": finish_reason, "tokens": tokens, "seconds": seconds,
            "tokens_per_second": rate, "cached_tokens": cached_tokens, "cache_write_tokens": cache_write_tokens,
            "drafts": drafts, "drafted": drafted, "accepted": accepted, "draft_method": draft_method,
            "weight_version": weight_version}


def upstream_event(server: str, address: str, port: int, route: str, *, moved_from: str | None = None,
                   retry_after: dict | None = None, receipt: dict | None = None) -> UpstreamEvent:
    return {"type": "upstream", "server": server, "address": address, "port": port, "route": route,
            "moved_from": moved_from, "retry_after": retry_after, "receipt": receipt}
