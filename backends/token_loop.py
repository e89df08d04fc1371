"""The decode loop every in-process backend runs after prefill (local, llama.cpp): emit each chosen
token, then choose the next, until a stop token, `max_tokens` or the client leaves.

What differs between backends is how the next token is chosen (`choose_after`: one forward pass and
the sampler) and how drafts are verified (`drafting`, speculative decoding); the order of events,
the detokenizing and the reasons a generation ends are the same, and live here once.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

from looptrace.common.vocabulary import Vocabulary

from .base import DecodeRequest
from .events import done_event, token_event
from .sampling import Choice


class Verifier(Protocol):
    """Speculative decoding as the loop sees it (speculative.Drafting, llama_cpp.Drafting)."""

    drafts: int
    drafted: int
    accepted: int
    method: str  # speculative_config.METHODS: each drafted token says which

    def seen(self, token: int) -> None: ...

    def step(self, last: int, room: int) -> list[tuple[Choice, int, int]]:
        """One verification pass after `last`: each token up to the first rejected draft as (choice,
        drafted, accepted), or [] when nothing was worth drafting."""


def run_tokens(request: DecodeRequest, vocab: Vocabulary, emit: Callable[[object], None], first: Choice,
               choose_after: Callable[[int], Choice], *, drafting: Verifier | None = None, cached: int = 0,
               written: int = 0) -> None:
    """Emits `first` and every token after it, then `done`. `choose_after(token)`: the next token's
    choice once `token` is in the model's state (a forward pass, then the sampler)."""
    stop_ids, cancel, max_tokens = request.stop_ids, request.cancel, request.max_tokens
    detokenizer = vocab.detokenizer(request.prompt_ids[-4:])
    pieces, special = vocab.pieces, vocab.special
    first_at = time.perf_counter()
    method = drafting.method if drafting is not None else ""
    count, finish = 0, ""
    ready = deque([(first, 0, 0)])  # chosen, not yet emitted: (choice, drafted, accepted)
    while True:
        choice, drafted, accepted = ready.popleft()
        token_id = choice.token_id
        count += 1
        if token_id in stop_ids:
            finish, text = "stop", ""
        else:
            text = detokenizer.step(token_id)
            if count >= max_tokens or cancel.is_set():
                finish = "length" if count >= max_tokens else "cancelled"
                text += detokenizer.flush()  # the last token: bytes held back come out now
        emit(token_event(count - 1, token_id, pieces[token_id] if token_id < len(pieces) else "", text,
                         token_id in special, choice.logprob, choice.rank, choice.top_ids, choice.top_logprobs,
                         drafted, accepted, method if drafted else ""))
        if finish:
            break
        if drafting is not None:
            drafting.seen(token_id)
            if not ready:  # one verification pass gives every token up to the first rejected draft
                ready.extend(drafting.step(token_id, max_tokens - count))
        if not ready:
            ready.append((choose_after(token_id), 0, 0))
    spec = (drafting.drafts, drafting.drafted, drafting.accepted) if drafting is not None else (0, 0, 0)
    emit(done_event(finish, count, time.perf_counter() - first_at, cached_tokens=cached, cache_write_tokens=written,
                    drafts=spec[0], drafted=spec[1], accepted=spec[2], draft_method=method))
