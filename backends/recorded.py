"""The replay backend: recorded model output served again, one recorded step per request.

Each step is the raw text the model wrote (special tokens included) or its token ids. The text is
tokenized with the checkpoint's own tokenizer and goes through the same parser, API adapters and
tracing as real decoding, token by token: a session reproduces without a GPU, and real clients can
be driven through tool calls deterministically. It promises the recorded tokens, not their
probabilities: every token is reported with p = 1.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import AsyncIterator

from looptrace.common.vocabulary import Vocabulary

from .base import BackendError, DecodeRequest, Loader, TextModel, TokenScore
from .events import Event, done_event, prefill_event, token_event


def read_steps(path: str | Path) -> list[dict]:
    steps = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            step = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not JSON: {exc}") from exc
        if not isinstance(step, dict) or not (isinstance(step.get("text"), str) or isinstance(step.get("token_ids"), list)):
            raise ValueError(f'{path}:{number}: expected {{"text": "..."}} or {{"token_ids": [...]}}')
        steps.append(step)
    if not steps:
        raise ValueError(f"{path} holds no steps")
    return steps


class ReplayLoader(Loader):
    """MODEL is the checkpoint whose tokenizer and template render the prompts; no weights."""

    def load(self, model: TextModel) -> ReplayBackend:
        """A JSON Lines file of steps, or traces from the store."""
        spec = self.settings.replay
        path = Path(spec).expanduser()
        steps = read_steps(path) if path.is_file() else self.host.stored_steps(spec)
        return ReplayBackend(steps, model.vocab)


class ReplayBackend:
    name = "replay"
    route = None
    expands_media = False
    media_refusal = ""
    serving = True  # up, whether or not it has answers left (/health says `replay.spent`)
    upstreams: tuple = ()

    def __init__(self, steps: list[dict], vocab: Vocabulary) -> None:
        self.vocab = vocab
        tokenizer = vocab.tokenizer
        self._steps = [
            list(step["token_ids"]) if "token_ids" in step else tokenizer.encode(step["text"], add_special_tokens=False)
            for step in steps
        ]
        self._next = 0
        self.running = 0
        self.waiting = 0  # one request's turn does not wait for another's

    def health_details(self) -> dict:
        spent = self._next >= len(self._steps)
        return {"replay": {"steps": len(self._steps), "served": self._next, "spent": spent},
                **({"reason": "the replay is spent: every recorded step was served"} if spent else {})}

    async def score(self, prompt_ids: list[int], answer_ids: list[int],
                    cache_salt: str | None = None) -> list[TokenScore]:
        raise BackendError("The replay backend serves recorded output and has no model to score with.", status=400,
                           code="score_unsupported")

    async def generate(self, request: DecodeRequest) -> AsyncIterator[Event]:
        if self._next >= len(self._steps):
            # Not a failure: the server is out of answers, as a server out of capacity is (503).
            raise BackendError(
                f"the replay is spent: all {len(self._steps)} recorded steps were served; restart looptrace (or give "
                "--replay a longer recording) to serve more", status=503, code="replay_exhausted",
            )
        ids = self._steps[self._next]
        self._next += 1
        self.running += 1
        try:
            yield prefill_event(len(request.prompt_ids), 0, 0.0)
            special = self.vocab.special
            detokenizer = self.vocab.detokenizer(request.prompt_ids[-4:])
            started = time.perf_counter()
            count, finish = 0, ""
            for position, token_id in enumerate(ids):
                if request.cancel.is_set():
                    finish = "cancelled"
                    break
                count += 1
                if token_id in request.stop_ids:
                    finish, text = "stop", ""
                else:
                    text = detokenizer.step(token_id)
                    if count >= request.max_tokens or position == len(ids) - 1:
                        # A recording that ends without a stop token was a whole answer.
                        finish = "length" if count >= request.max_tokens and position < len(ids) - 1 else "stop"
                        text += detokenizer.flush()
                yield token_event(count - 1, token_id, self.vocab.piece(token_id), text, token_id in special,
                                  0.0, 1, [token_id], [0.0])
                if finish:
                    break
                await asyncio.sleep(0)  # let the loop see a disconnect between tokens
            finish = finish or "stop"
            yield done_event(finish, count, time.perf_counter() - started, cached_tokens=0)
        finally:
            self.running -= 1

    async def close(self) -> None:
        return None
