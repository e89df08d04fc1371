"""Teacher-forced scoring for the backends that decode here (local, llama.cpp): the model reads a
given prompt and a given answer in one prefill, nothing is generated, and each answer token gets the
model's logprob of it, its rank and the model's own greedy choice there (base.TokenScore).

What it promises: the numbers a generation of that answer would have reported token by token (the
token events' logprob and rank, at T = 1), up to the rounding of reading many positions in one batch
rather than one at a time. Logits are kept for the answer's positions only, a bounded number of
rows at a time, so a long answer never holds a vocabulary-wide row for every token at once.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from .base import BackendError, TokenScore

ROW_FLOATS = 1 << 26  # logits held at once, at most: 256 MB of float32 (270 rows of a 248K vocabulary)


def rows_at_once(vocab_size: int) -> int:
    return max(1, ROW_FLOATS // max(1, vocab_size))


def scores_of(rows: torch.Tensor, answer_ids: list[int]) -> list[TokenScore]:
    """Row i holds the logits that predict answer_ids[i]."""
    rows = rows.float()
    ids = torch.tensor(answer_ids, dtype=torch.long, device=rows.device)
    norm = torch.logsumexp(rows, dim=-1)
    chosen = rows.gather(1, ids[:, None])[:, 0]
    # Ranked as the token events are (sampling.report): 1 + the tokens strictly more likely.
    rank = (rows > chosen[:, None]).sum(dim=1) + 1
    greedy = rows.argmax(dim=1)  # the first maximum: equally likely tokens go lowest id first, as greedy decoding does
    best = rows.gather(1, greedy[:, None])[:, 0]
    columns = torch.stack((chosen - norm, rank.to(norm.dtype), greedy.to(norm.dtype), best - norm)).double().tolist()
    return [{"id": token, "logprob": logprob, "rank": int(r), "greedy_id": int(g), "greedy_logprob": g_logprob}
            for token, logprob, r, g, g_logprob in zip(answer_ids, *columns)]


def check_fits(prompt_ids: list[int], answer_ids: list[int], context: int) -> None:
    if not prompt_ids or not answer_ids:
        raise BackendError("scoring needs a prompt and an answer of at least one token each", status=400,
                           code="invalid_request_error")
    # The answer's last token is scored, never read: the model reads prompt + answer less one.
    needed = len(prompt_ids) + len(answer_ids) - 1
    if needed > context:
        raise BackendError(f"{len(prompt_ids)} prompt tokens and {len(answer_ids)} answer tokens do not fit in the "
                           f"context of {context}", status=400, code="context_length_exceeded")


def score_transformers(model, prompt_ids: list[int], answer_ids: list[int],
                       prepare: Callable[[object], None]) -> list[TokenScore]:
    """On the local backend's decode thread. `prepare` readies the model for a new prompt (Qwen3.5's
    rope offset cleared: local.reset_model_state)."""
    vocab = model.get_output_embeddings().weight.shape[0]
    per = rows_at_once(vocab)
    device = next(model.parameters()).device
    n = len(answer_ids)
    with torch.inference_mode():
        prepare(model)
        first = min(n, per)
        # The prompt and the answer's first tokens in one call; the logits of its last `first` positions
        # predict answer_ids[:first].
        ids = torch.tensor([prompt_ids + answer_ids[:first - 1]], device=device)
        out = model(input_ids=ids, use_cache=first < n, logits_to_keep=first)
        scores = scores_of(out.logits[0], answer_ids[:first])
        cache, at = out.cache if first < n else None, first
        while at < n:  # a long answer: the rest a bounded number of rows at a time, after the cache
            take = min(per, n - at)
            out = model(input_ids=torch.tensor([answer_ids[at - 1:at - 1 + take]], device=device), cache=cache,
                        use_cache=True, logits_to_keep=take)
            scores += scores_of(out.logits[0], answer_ids[at:at + take])
            cache, at = out.cache, at + take
    return scores


def score_llama_cpp(context, reuse, prompt_ids: list[int], answer_ids: list[int], batch: int,
                    salt: str | None = None) -> list[TokenScore]:
    """On the llama.cpp backend's decode thread: the prompt after whatever prefix its KV cache can
    reuse (llama_cpp/reuse.py), then the answer a batch at a time with logits for every row, each
    row read in place before the next batch overwrites it. `salt`: the tenant's (reuse.py)."""
    check_fits(prompt_ids, answer_ids, context.n_ctx)
    held = reuse.prepare(prompt_ids, None, salt)
    context.eval(prompt_ids[held:])
    rows = [np.array(context.logits(-1))]  # the prompt's last position predicts the answer's first token
    scores: list[TokenScore] = []
    read = answer_ids[:-1]  # the last answer token is scored, never read
    for start in range(0, len(read), batch):
        chunk = read[start:start + batch]
        scores += scores_of(torch.from_numpy(np.stack(rows)), answer_ids[len(scores):len(scores) + len(rows)])
        context.eval(chunk, every_row=True)
        rows = [np.array(context.logits(i)) for i in range(len(chunk))]
    scores += scores_of(torch.from_numpy(np.stack(rows)), answer_ids[len(scores):])
    return scores
