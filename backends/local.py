"""The local backend: a transformers model decoded on this machine, one request at a time.

Its promise: greedy decoding matches `model.generate()` token for token (same forward calls, same
argmax). The model runs in one worker thread, so the event loop never runs model code; requests
wait in a FIFO queue, and past its bound they are refused with a 429.
"""

from __future__ import annotations

import asyncio
import math
import queue
import threading
import time
from typing import AsyncIterator, Callable

import torch

from .base import TOP_N, BackendError, Busy, DecodeRequest
from .detokenize import Vocabulary
from .sampling import choose, generator_for, report


def prefill(model, prompt: torch.Tensor):
    """Run the whole prompt once; keep only the last position's logits."""
    out = model(input_ids=prompt, use_cache=True, logits_to_keep=1)
    return out.logits[0, -1].float(), out.cache


def decode_one_token(model, token: torch.Tensor, cache) -> torch.Tensor:
    out = model(input_ids=token.view(1, 1), cache=cache, use_cache=True)
    return out.logits[0, -1].float()


def reset_model_state(model) -> None:
    # Qwen3.5 keeps the multimodal rope offset of the last prompt on the model; a stale one
    # shifts every position of the next request.
    inner = getattr(model, "model", None)
    if inner is not None and getattr(inner, "rope_deltas", None) is not None:
        inner.rope_deltas = None


Emit = Callable[[object], None]


class LocalBackend:
    name = "local"

    def __init__(self, model, vocab: Vocabulary, *, max_queue: int = 64) -> None:
        self.model = model
        self.vocab = vocab
        self.device = next(model.parameters()).device
        self.max_queue = max_queue
        self.running = 0
        self._jobs: queue.Queue = queue.Queue()
        self._worker = threading.Thread(target=self._work, name="looptrace-decode", daemon=True)
        self._worker.start()

    async def generate(self, request: DecodeRequest) -> AsyncIterator[dict]:
        if self.waiting >= self.max_queue:
            raise Busy(f"{self.waiting} requests are already waiting for the model; try again later")
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def emit(event: object) -> None:
            try:
                loop.call_soon_threadsafe(events.put_nowait, event)
            except RuntimeError:  # the loop is gone: nobody is listening any more
                request.cancel.set()

        self._jobs.put((request, emit))
        try:
            while True:
                event = await events.get()
                if isinstance(event, BaseException):
                    raise event
                yield event
                if event["type"] == "done":
                    return
        finally:
            # However the consumer leaves (disconnect, stop string, error), the worker stops at the next token.
            request.cancel.set()

    @property
    def waiting(self) -> int:
        return self._jobs.qsize()

    async def close(self) -> None:
        self._jobs.put((None, None))

    def _work(self) -> None:
        while True:
            request, emit = self._jobs.get()
            if request is None:
                return
            if request.cancel.is_set():  # the client left while it waited
                emit(_done("cancelled", 0, 0.0))
                continue
            self.running += 1
            try:
                with torch.inference_mode():
                    self._decode(request, emit)
            except Exception as exc:  # noqa: BLE001 - the client must hear why, the worker must live on
                emit(BackendError(f"local decoding failed: {type(exc).__name__}: {exc}", status=500, code="decode_failed"))
            finally:
                self.running -= 1

    def _decode(self, request: DecodeRequest, emit: Emit) -> None:
        model, vocab, sampling = self.model, self.vocab, request.sampling
        stop_ids, cancel = request.stop_ids, request.cancel
        generator = generator_for(sampling, self.device)
        reset_model_state(model)

        started = time.perf_counter()
        logits, cache = prefill(model, torch.tensor([request.prompt_ids], device=self.device))
        token = choose(logits, sampling, generator)
        numbers = report(logits, token)
        emit({"type": "prefill", "prompt_tokens": len(request.prompt_ids), "cached_tokens": 0,
              "seconds": time.perf_counter() - started})

        detokenizer = vocab.detokenizer(request.prompt_ids[-4:])
        pieces, special = vocab.pieces, vocab.special
        first_at = time.perf_counter()
        count, finish = 0, ""
        while True:
            token_id = int(numbers[0])
            count += 1
            stop = token_id in stop_ids
            if stop:
                finish, text = "stop", ""
            else:
                text = detokenizer.step(token_id)
                if count >= request.max_tokens or cancel.is_set():
                    finish = "length" if count >= request.max_tokens else "cancelled"
                    text += detokenizer.flush()
            logprob = numbers[1]
            emit({
                "type": "token", "index": count - 1, "id": token_id,
                "piece": pieces[token_id] if token_id < len(pieces) else "", "text": text,
                "special": token_id in special, "logprob": logprob, "p": math.exp(logprob), "rank": int(numbers[2]),
                "top_ids": [int(i) for i in numbers[3:3 + TOP_N]], "top_logprobs": numbers[3 + TOP_N:],
            })
            if finish:
                break
            logits = decode_one_token(model, token, cache)
            token = choose(logits, sampling, generator)
            numbers = report(logits, token)
        emit(_done(finish, count, time.perf_counter() - first_at))


def _done(finish: str, count: int, seconds: float) -> dict:
    # The first token came out of prefill, so the decode rate counts the ones after it.
    rate = (count - 1) / seconds if count > 1 and seconds > 0 else 0.0
    return {"type": "done", "finish_reason": finish, "tokens": count, "seconds": seconds,
            "tokens_per_second": rate, "drafts": 0, "drafted": 0, "accepted": 0}
