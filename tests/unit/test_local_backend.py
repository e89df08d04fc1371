"""The local backend's promise: greedy output equals model.generate() token for token in float32."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch
from transformers import AutoModelForCausalLM

from looptrace.backends.base import Busy, DecodeRequest, SamplingParams
from looptrace.backends.local.backend import LocalBackend, decode_one_token, prefill

import load_once
from tiny_models import chat_prompt_ids
from waiting import wait_until_async

NEW_TOKENS = 48


def load(folder):
    tokenizer = load_once.tokenizer(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return tokenizer, model


def collect(backend, request):
    async def run():
        return [event async for event in backend.generate(request)]

    return asyncio.run(run())


@pytest.fixture(scope="module", params=["qwen3_5", "gemma4"])
def loaded(request):
    folder = request.getfixturevalue(f"{request.param}_dir")
    tokenizer, model = load(folder)
    backend = LocalBackend(model, load_once.vocabulary(tokenizer), max_queue=2)
    yield tokenizer, model, backend
    asyncio.run(backend.close())


def test_greedy_equals_generate(loaded):
    tokenizer, model, backend = loaded
    prompt = chat_prompt_ids(tokenizer)
    with torch.inference_mode():
        expected = model.generate(
            torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0,
        )[0, len(prompt):].tolist()
    assert len(set(expected)) >= 8, "the tiny model must not be degenerate, or equality proves little"

    events = collect(backend, DecodeRequest(prompt, NEW_TOKENS, SamplingParams(temperature=0), frozenset()))
    kinds = [e["type"] for e in events]
    assert kinds == ["prefill"] + ["token"] * NEW_TOKENS + ["done"]
    tokens = [e for e in events if e["type"] == "token"]
    assert [t["id"] for t in tokens] == expected
    assert [t["index"] for t in tokens] == list(range(NEW_TOKENS))
    # Incremental text, joined, is the whole sequence decoded at once.
    assert "".join(t["text"] for t in tokens) == tokenizer.decode(expected)
    assert events[0]["prompt_tokens"] == len(prompt)
    assert events[-1]["finish_reason"] == "length" and events[-1]["tokens"] == NEW_TOKENS
    # Greedy picks the most likely token: rank 1, and it heads the top five.
    assert all(t["rank"] == 1 and t["top_ids"][0] == t["id"] for t in tokens)
    assert all(0 < t["p"] <= 1 and len(t["top_ids"]) == 5 for t in tokens)


def test_a_stop_token_ends_with_stop_and_contributes_no_text(loaded):
    tokenizer, model, backend = loaded
    prompt = chat_prompt_ids(tokenizer)
    greedy = [e["id"] for e in collect(backend, DecodeRequest(prompt, 12, SamplingParams(temperature=0), frozenset()))
              if e["type"] == "token"]
    stop_at = 7
    events = collect(backend, DecodeRequest(prompt, 12, SamplingParams(temperature=0), frozenset({greedy[stop_at]})))
    tokens = [e for e in events if e["type"] == "token"]
    first = greedy.index(greedy[stop_at])  # the stop id may occur earlier in the sequence
    assert [t["id"] for t in tokens] == greedy[: first + 1]
    assert tokens[-1]["text"] == ""
    assert events[-1]["finish_reason"] == "stop"


def test_sampling_with_a_seed_repeats(loaded):
    tokenizer, model, backend = loaded
    prompt = chat_prompt_ids(tokenizer)
    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, seed=11)
    runs = [[e["id"] for e in collect(backend, DecodeRequest(prompt, 16, params, frozenset())) if e["type"] == "token"]
            for _ in range(2)]
    assert runs[0] == runs[1]


def test_penalties_steer_greedy_decoding_by_what_was_already_said(loaded):
    tokenizer, model, backend = loaded
    prompt = chat_prompt_ids(tokenizer)

    def tokens(**penalties):
        request = DecodeRequest(prompt, NEW_TOKENS, SamplingParams(temperature=0, **penalties), frozenset())
        return [e for e in collect(backend, request) if e["type"] == "token"]

    plain = [t["id"] for t in tokens()]
    # A presence penalty larger than any gap between logits forbids every repeat (the tiny Gemma repeats
    # itself within 48 tokens without it; the tiny Qwen, with a 248k vocabulary, does not)...
    avoiding = tokens(presence_penalty=100.0)
    ids = [t["id"] for t in avoiding]
    assert len(set(ids)) == len(ids)
    # The reference runs the way the backend does (prefill, then one cached step per token) on the
    # backend's own thread: one forward pass over the whole sequence sums in another order, and its
    # logprobs differ from cached decoding by up to ~2e-3 in float32, more than the report's tolerance.
    def reference() -> torch.Tensor:
        with torch.inference_mode():
            first, cache = prefill(model, torch.tensor([prompt]))
            rest = [decode_one_token(model, token, cache) for token in ids[:-1]]
        return torch.stack([first, *rest])

    logits = backend.call(reference)
    for step, token in enumerate(ids):
        seen = torch.zeros(logits.shape[-1])
        seen[ids[:step]] = 1.0
        assert token == int((logits[step] - 100.0 * seen).argmax())
        # ... while what the trace reports stays the model's own view of the token.
        own = (logits[step, token] - torch.logsumexp(logits[step], -1)).item()
        assert avoiding[step]["logprob"] == pytest.approx(own, abs=1e-6)
    # ... and a negative frequency penalty that large makes the first token say itself forever.
    repeating = [t["id"] for t in tokens(frequency_penalty=-100.0)]
    assert repeating == [plain[0]] * NEW_TOKENS


def test_cancel_stops_before_the_next_token(loaded):
    tokenizer, model, backend = loaded
    request = DecodeRequest(chat_prompt_ids(tokenizer), 200, SamplingParams(temperature=0), frozenset())

    async def run():
        seen = []
        async for event in backend.generate(request):
            seen.append(event)
            if event["type"] == "token" and event["index"] == 2:
                request.cancel.set()
        return seen

    events = asyncio.run(run())
    tokens = [e for e in events if e["type"] == "token"]
    assert events[-1]["type"] == "done" and events[-1]["finish_reason"] == "cancelled"
    # The worker may have had one step in flight when the flag went up, never more.
    assert 3 <= len(tokens) <= 4


@pytest.mark.timeout(120)
def test_the_queue_refuses_past_its_bound(loaded):
    tokenizer, model, backend = loaded
    prompt = chat_prompt_ids(tokenizer)
    held, gate = threading.Event(), threading.Event()

    def greedy(n=1):
        return DecodeRequest(prompt, n, SamplingParams(temperature=0), frozenset())

    def hold(event):
        held.set()
        gate.wait()

    async def run():
        # Hold the worker inside a job (past its prefill, which would otherwise compete for the cores),
        # so the next requests wait in the queue (bound: 2).
        backend._thread._jobs.put((greedy(), hold))
        await asyncio.to_thread(held.wait)
        waiting = [backend.generate(greedy()) for _ in range(2)]
        firsts = [asyncio.ensure_future(anext(w)) for w in waiting]
        # Each consumer queues its job on its first step; on a loaded machine that can take a while.
        await wait_until_async(lambda: backend.waiting >= 2, 60, every=0.01)
        assert backend.waiting == 2
        with pytest.raises(Busy):
            await anext(backend.generate(greedy()))
        gate.set()
        # The two that waited are served, in order, once the worker is free.
        for first, stream in zip(firsts, waiting):
            assert (await first)["type"] == "prefill"
            assert [e["type"] async for e in stream][-1] == "done"

    try:
        asyncio.run(run())
    finally:
        gate.set()
