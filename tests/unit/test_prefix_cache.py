"""The local backend's prefix cache: an agent's next turn prefills only what is new, and decodes the same."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import AutoModelForCausalLM

from looptrace.backends.base import DecodeRequest, SamplingParams
from looptrace.backends.local.backend import LocalBackend
from looptrace.backends.local.prefix_cache import PrefixCache

import load_once
from tiny_models import chat_prompt_ids

# -- the bookkeeping, with stand-in caches --


class Box:
    """Stands in for a model's cache: deep-copyable state."""

    def __init__(self, values):
        self.values = list(values)


def test_the_longest_kept_prompt_that_starts_the_new_one_is_taken():
    kept = PrefixCache(max_tokens=100)
    kept.keep([1, 2], Box("a"), torch.zeros(3))
    kept.keep([1, 2, 3, 4], Box("b"), torch.ones(3))
    kept.keep([1, 9, 9], Box("c"), torch.zeros(3))
    cached, entry = kept.take([1, 2, 3, 4, 5, 6])
    assert cached == 4 and entry.cache.values == ["b"] and entry.logits.tolist() == [1.0, 1.0, 1.0]
    # Taken means gone: the caller's decoding changes that state.
    cached, entry = kept.take([1, 2, 3, 4, 5])
    assert cached == 2 and entry.cache.values == ["a"]
    assert kept.take([7, 8]) == (0, None)
    assert len(kept) == 1 and kept.tokens == 3


def test_what_is_kept_is_a_copy_taken_before_decoding_changes_it():
    kept = PrefixCache(max_tokens=100)
    state = Box([1])
    kept.keep([5, 6], state, torch.zeros(2))
    state.values.append(2)  # decoding goes on with the original
    assert kept.take([5, 6, 7])[1].cache.values == [1]


def test_the_token_budget_evicts_the_least_recently_kept_and_skips_what_cannot_fit():
    kept = PrefixCache(max_tokens=6)
    kept.keep([1, 1, 1], Box("a"), torch.zeros(1))
    kept.keep([2, 2, 2], Box("b"), torch.zeros(1))
    kept.keep([3, 3], Box("c"), torch.zeros(1))  # 8 > 6: the oldest goes
    assert (len(kept), kept.tokens) == (2, 5)
    assert kept.take([1, 1, 1, 1]) == (0, None)
    kept.keep(list(range(7)), Box("d"), torch.zeros(1))  # larger than the whole budget: not kept
    assert (len(kept), kept.tokens) == (2, 5)



def test_the_byte_budget_counts_what_does_not_grow_with_the_prompt():
    # Each entry's last logits (a vocabulary of floats) and fixed state: short prompts once filled
    # gigabytes within the token budget (bench/soak.py on the tiny Qwen3.5: ~1.8 MB a prompt).
    class State:
        def __init__(self) -> None:
            self.layers = [{"conv": torch.zeros(256)}, (torch.zeros(128),)]  # 1,536 bytes

    kept = PrefixCache(max_tokens=1000, max_bytes=3 * (1536 + 1024))
    for i in range(5):
        assert kept.keep([i], State(), torch.zeros(256))
    assert (len(kept), kept.bytes) == (3, 3 * 2560)
    assert kept.take([0]) == (0, None) and kept.take([4])[0] == 1
    assert kept.bytes == 2 * 2560
    assert not kept.keep([9], State(), torch.zeros(10_000))  # alone past the budget: not kept

# -- the real models: a continued prompt decodes exactly as a fresh one --

NEW_TOKENS = 16


@pytest.fixture(scope="module", params=["qwen3_5", "gemma4"])
def backends(request):
    folder = request.getfixturevalue(f"{request.param}_dir")
    tokenizer = load_once.tokenizer(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    caching = LocalBackend(model, load_once.vocabulary(tokenizer), prefix_cache_tokens=4096)
    plain = LocalBackend(model, load_once.vocabulary(tokenizer))
    yield tokenizer, caching, plain
    asyncio.run(caching.close())
    asyncio.run(plain.close())


def run(backend, prompt, keep_at=None):
    async def collect():
        request = DecodeRequest(prompt, NEW_TOKENS, SamplingParams(temperature=0), frozenset(), keep_at=keep_at)
        return [event async for event in backend.generate(request)]

    events = asyncio.run(collect())
    return events[0], [e for e in events if e["type"] == "token"]


def test_the_next_turn_reuses_the_last_prompt_and_decodes_the_same(backends):
    tokenizer, caching, plain = backends
    caching.prefix_cache = PrefixCache(max_tokens=4096)  # cold, whatever ran before (the decode thread is idle)
    first = chat_prompt_ids(tokenizer)
    prefill, answer = run(caching, first)
    assert prefill["cached_tokens"] == 0
    # The next turn: the prompt so far, the answer, a tool's result. Longer than Gemma's sliding
    # window (32 tokens in the tiny model), so the kept window has to move on correctly too.
    result = tokenizer("\nThe tool printed: " + "ok " * 40, add_special_tokens=False)["input_ids"]
    second = first + [t["id"] for t in answer] + result
    prefill, continued = run(caching, second)
    assert prefill["cached_tokens"] == len(first) and prefill["prompt_tokens"] == len(second)
    _, fresh = run(plain, second)
    assert [t["id"] for t in continued] == [t["id"] for t in fresh]
    assert [t["logprob"] for t in continued] == pytest.approx([t["logprob"] for t in fresh], abs=1e-3)
    # The same prompt again (a retry): nothing to prefill, the same answer.
    prefill, again = run(caching, second)
    assert prefill["cached_tokens"] == len(second)
    assert [t["id"] for t in again] == [t["id"] for t in fresh]
    # A prompt that leaves the kept ones part-way gets no reuse, and is still right.
    other = first[:-1] + [first[-1] + 1]
    prefill, diverged = run(caching, other)
    assert prefill["cached_tokens"] == 0
    assert [t["id"] for t in diverged] == [t["id"] for t in run(plain, other)[1]]


def test_the_state_is_kept_where_the_next_request_will_branch(backends):
    # Gemma 4 with thinking off ends its prompt with an empty thought channel the next turn leaves out:
    # the state is kept before it (`keep_at`), and the next turn picks up from there.
    tokenizer, caching, plain = backends
    caching.prefix_cache = PrefixCache(max_tokens=4096)
    prompt = chat_prompt_ids(tokenizer)
    tail = 3
    prefill, first = run(caching, prompt, keep_at=len(prompt) - tail)
    _, fresh_first = run(plain, prompt)
    assert [t["id"] for t in first] == [t["id"] for t in fresh_first]  # prefilled in two parts, same answer
    following = prompt[:-tail] + tokenizer("A reply, then more.", add_special_tokens=False)["input_ids"]
    prefill, continued = run(caching, following)
    assert prefill["cached_tokens"] == len(prompt) - tail
    assert [t["id"] for t in continued] == [t["id"] for t in run(plain, following)[1]]


def test_what_a_request_adds_to_the_cache_is_reported(backends):
    # The Responses API's usage.input_tokens_details.cache_write_tokens, and the span's
    # gen_ai.usage.cache_creation.input_tokens: the prompt tokens whose state this request kept.
    tokenizer, caching, plain = backends

    def written(backend, prompt: list[int]) -> int:
        async def collect():
            request = DecodeRequest(prompt, 2, SamplingParams(temperature=0), frozenset())
            return [event async for event in backend.generate(request)]
        return asyncio.run(collect())[-1]["cache_write_tokens"]

    caching.prefix_cache = PrefixCache(max_tokens=4096)
    first = chat_prompt_ids(tokenizer)
    assert written(caching, first) == len(first)
    second = first + tokenizer(" and then some more", add_special_tokens=False)["input_ids"]
    assert written(caching, second) == len(second) - len(first)  # the first prompt's state was read, not written
    assert written(caching, second) == 0  # kept already
    assert written(plain, second) == 0  # no prefix cache
    caching.prefix_cache = PrefixCache(max_tokens=len(first) - 1)
    assert written(caching, first) == 0  # longer than the whole bound: not kept
