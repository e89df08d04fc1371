"""vLLM's wire format as looptrace speaks it: the request bodies, and the tokens read out of a chunk.

No I/O here. Field names are vLLM's own (vllm 0.33: `CompletionRequest`, `SamplingParams`,
`GenerateRequest`, `CompletionStreamResponse`, `GenerateTokensStreamResponse`);
tests/integration/test_vllm_protocol.py checks them against the models in the vllm wheel, because vLLM's
OpenAI models accept unknown fields silently: a misspelt name would simply do nothing.

A token read from a chunk is a tuple `(id, logprob, rank, top_ids, top_logprobs)`; rank is None
where the route does not say it (see `completions_tokens`).
"""

from __future__ import annotations

import math
import operator
import re

from ..base import DecodeRequest
from ..events import TOP_N

COMPLETIONS = "/v1/completions"
GENERATE = "/inference/v1/generate"  # vLLM started with --enable-scale-out

# Sampling settings the client cannot set, sent so they do nothing. vLLM fills any setting a request
# leaves out from the checkpoint's generation_config (a repetition_penalty of 1.05, say), which would
# change the distribution behind looptrace's back.
NEUTRAL = {"min_p": 0.0, "repetition_penalty": 1.0}

_ID_PREFIX = len("token_id:")
MAX_WEIGHT_LABEL = 256  # characters of a weight version kept


def sampling_fields(request: DecodeRequest, max_tokens: int) -> dict:
    """The settings both routes share (top-level on /v1/completions, `sampling_params` on generate)."""
    s = request.sampling
    fields = {
        "max_tokens": max_tokens,
        "temperature": s.temperature,  # 0 is greedy for vLLM too
        "top_p": s.top_p,
        "top_k": s.top_k,  # 0: no limit
        **NEUTRAL,
        "presence_penalty": s.presence_penalty,  # 0 unless the client asked
        "frequency_penalty": s.frequency_penalty,
        "stop_token_ids": sorted(request.stop_ids),
        "logprobs": TOP_N,
        "skip_special_tokens": False,  # otherwise tool-call markers vanish from the output
    }
    if s.seed is not None:
        fields["seed"] = s.seed
    return fields


def salted(body: dict, cache_salt: str | None) -> dict:
    """`body` with the tenant's `cache_salt` (both routes take it at the top level): vLLM hashes it into
    the prompt's first block, so no other salt's cached blocks are found. None (no tenant): as before."""
    if cache_salt is not None:
        body["cache_salt"] = cache_salt
    return body


def completions_body(model: str, request: DecodeRequest, max_tokens: int) -> dict:
    return salted({
        "model": model,
        "prompt": request.prompt_ids,
        "stream": True,
        "stream_options": {"include_usage": True},
        **sampling_fields(request, max_tokens),
        "return_tokens_as_token_ids": True,  # logprob keys "token_id:N": ids, not ambiguous strings
        "return_token_ids": True,
    }, request.cache_salt)


def generate_body(model: str, request: DecodeRequest, max_tokens: int) -> dict:
    body = {
        "model": model,
        "token_ids": request.prompt_ids,
        # looptrace decodes the text itself: the server need not.
        "sampling_params": {**sampling_fields(request, max_tokens), "detokenize": False},
        "stream": True,
        "stream_options": {"include_usage": True},
        "output_mode": "tokens",
    }
    if request.media_urls:
        # vLLM resolves `content_parts` (its serving code reads "type" and "url") and its processor
        # expands each item's placeholder in `token_ids`, so those are the template's, unexpanded. It
        # says what the prompt became in the first chunk (`prompt_token_ids`), compared with ours.
        body["token_ids"] = request.template_ids
        body["content_parts"] = [{"type": f"{kind}_url", "url": url} for kind, url in request.media_urls]
        body["return_token_ids"] = True
    return salted(body, request.cache_salt)


def completions_tokens(choice: dict) -> list[tuple]:
    """Tokens of one `/v1/completions` stream choice.

    `top_logprobs` maps "token_id:N" to a logprob: the sampled token first, then the five most
    likely, so six entries when the sampled token is not among them. This route gives no rank:
    it is known only when the token is in the top five.
    """
    logprobs = choice.get("logprobs") or {}
    ids = choice.get("token_ids")
    if ids is None:  # a server without return_token_ids still names the ids in the logprob keys
        ids = [int(t[_ID_PREFIX:]) for t in logprobs.get("tokens") or ()]
    token_logprobs = logprobs.get("token_logprobs") or ()
    tops = logprobs.get("top_logprobs") or ()
    out = []
    for i, token_id in enumerate(ids):
        logprob = token_logprobs[i] if i < len(token_logprobs) else None
        top = tops[i] if i < len(tops) else None
        if logprob is None or not top:
            raise ValueError(f"token {token_id} came without its logprobs")
        # Most likely first; a stable sort keeps the server's order among equals.
        ranked = sorted(top.items(), key=_second, reverse=True)[:TOP_N]
        top_ids = [int(k[_ID_PREFIX:]) for k, _ in ranked]
        rank = top_ids.index(token_id) + 1 if token_id in top_ids else None
        out.append((token_id, logprob, rank, top_ids, [v for _, v in ranked]))
    return out


def generate_tokens(choice: dict) -> list[tuple]:
    """Tokens of one `/inference/v1/generate` stream choice (output_mode "tokens").

    Each logprob entry has the sampled token's id, logprob and rank, and `top_logprobs`: the
    sampled token first, then the most likely ones, each with its rank.
    """
    content = (choice.get("logprobs") or {}).get("content") or ()
    ids = choice.get("token_ids") or [entry["token_id"] for entry in content]
    if len(content) != len(ids):
        raise ValueError(f"{len(ids)} tokens came with {len(content)} logprob entries")
    out = []
    for token_id, entry in zip(ids, content):
        ranked = entry.get("top_logprobs") or []
        if ranked and ranked[0].get("rank") != 1:  # the sampled token leads the list; at rank 1 it is in order
            ranked = sorted(ranked, key=_by_rank)
        ranked = ranked[:TOP_N]
        out.append((token_id, entry["logprob"], entry.get("rank"), [t["token_id"] for t in ranked],
                    [t["logprob"] for t in ranked]))
    return out


def error_message(body: object, fallback: str) -> str:
    """The server's own words from an error body: vLLM's `{"error": {"message"}}`, its bare
    `{"error": "Unauthorized"}`, or FastAPI's `{"detail": ...}`."""
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
        if isinstance(error, str):
            return error
        detail = body.get("detail")
        if isinstance(detail, str):
            return detail
        if detail is not None:
            return str(detail)
    return fallback


def weight_versions(spans: list | None) -> str | None:
    """The weights that sampled a response, from a choice's `weight_versions` (vLLM's final chunk: spans of output
    tokens, each `{"version", "start", "end"}`): the versions in the order they sampled, comma-separated where
    weights changed mid-answer; None where the server says nothing."""
    versions: list[str] = []
    for span in spans or ():
        version = weight_label(span.get("version") if isinstance(span, dict) else None)
        if version and (not versions or versions[-1] != version):
            versions.append(version)
    return ",".join(versions) or None


def weight_label(value: object) -> str | None:
    """A weight version as vLLM names it, where it is one: a printable string of at most MAX_WEIGHT_LABEL
    characters (it goes on spans and into exports as it is)."""
    if isinstance(value, str) and 0 < len(value) <= MAX_WEIGHT_LABEL and value.isprintable():
        return value
    return None


def speculative_counts(metrics: dict | None) -> tuple[int, int, int] | None:
    """(drafts, drafted, accepted) from a response's `metrics.speculative_decoding`, when sent."""
    spec = (metrics or {}).get("speculative_decoding")
    if not spec:
        return None
    return int(spec["num_spec_steps"]), int(spec["num_draft_tokens"]), int(spec["num_accepted_draft_tokens"])


_CACHE_LABEL = re.compile(r'\b(block_size|num_gpu_blocks)="(\d+)"')


def metrics_load(text: str) -> tuple[tuple[int, int] | None, int | None, int | None]:
    """From a vLLM server's /metrics (Prometheus text): its requests (running, waiting), each summed over its engines,
    and its prefix cache's block size and number of blocks (`vllm:cache_config_info`'s labels); None for what it
    does not say."""
    counts: dict[str, int] | None = None
    block_size = blocks = None
    for line in text.splitlines():
        if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting")):
            value = line.rpartition("}")[2].split() if "}" in line else line.split()[1:]
            counts = counts or {"running": 0, "waiting": 0}
            counts["running" if line.startswith("vllm:num_requests_running") else "waiting"] += int(float(value[0]))
        elif line.startswith("vllm:cache_config_info") and block_size is None:
            labels = dict(_CACHE_LABEL.findall(line))
            block_size = int(labels["block_size"]) if "block_size" in labels else None
            blocks = int(labels["num_gpu_blocks"]) if "num_gpu_blocks" in labels else None
    return (counts["running"], counts["waiting"]) if counts else None, block_size, blocks


_second = operator.itemgetter(1)


def _by_rank(entry: dict) -> float:
    rank = entry.get("rank")
    return rank if rank is not None else math.inf
