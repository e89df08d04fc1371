"""Speculative decoding's checks on one model, run on every architecture: the local backend's verified
output is the plain decoder's, token for token (tests/unit/test_speculative.py runs them on the tiny
Qwen3.5 and Gemma 4, tests/integration/test_speculative.py on SmolLM2).

Prompt lookup's verification and rollback are checked with an oracle drafter: it proposes the plain
decoder's own next tokens with mistakes put in on purpose (a rejection mid-way, a first draft wrong, all
right), so every path runs.
"""

from __future__ import annotations

import asyncio

import pytest

from looptrace.backends.base import DecodeRequest, SamplingParams
from looptrace.backends.local import backend as local_module
from looptrace.backends.local.backend import LocalBackend
from looptrace.backends.speculative.drafting import Drafting, SpeculativeConfig

import load_once

NGRAM = SpeculativeConfig.parse('{"method": "ngram", "num_speculative_tokens": 4}')


NEW_TOKENS = 72


def collect(backend: LocalBackend, request: DecodeRequest) -> list[dict]:
    async def run():
        return [event async for event in backend.generate(request)]

    return asyncio.run(run())


def tokens(events: list[dict]) -> list[dict]:
    return [e for e in events if e["type"] == "token"]


class Oracle:
    """Proposes what plain decoding produced next, wrong where `mistakes` says: by the proposal's
    number, the position in it to spoil (0: the first draft; None: all right)."""

    def __init__(self, prompt: list[int], truth: list[int], mistakes: dict[int, int | None]) -> None:
        self.length, self.truth, self.mistakes = len(prompt), truth, mistakes
        self.ids: list[int] = list(prompt)
        self.proposals = 0

    def append(self, token: int) -> None:
        self.ids.append(token)

    def propose(self, count: int) -> list[int]:
        done = len(self.ids) - self.length
        drafts = list(self.truth[done:done + count])
        spoil = self.mistakes.get(self.proposals % len(self.mistakes))
        self.proposals += 1
        if spoil is not None and spoil < len(drafts):
            drafts[spoil] = (drafts[spoil] + 1) % 1000 + 3
        return drafts


def prompt_of(tokenizer) -> list[int]:
    text = "Copy this list back: apples, pears, plums, cherries, apples, pears, figs. " * 3
    return tokenizer(text, add_special_tokens=False)["input_ids"]


class VerifiedDecodingChecks:
    """What every model is held to; a test module subclasses it (as Test...) beside a `model` fixture that
    gives (name, tokenizer, model)."""

    @pytest.mark.parametrize("sampling", [SamplingParams(temperature=0),
                                          SamplingParams(temperature=0, presence_penalty=0.7, frequency_penalty=0.2)],
                             ids=["greedy", "greedy-penalised"])
    def test_verified_output_is_the_plain_decoders(self, model, sampling, monkeypatch):
        name, tokenizer, loaded = model
        prompt = prompt_of(tokenizer)
        if name == "gemma4":
            assert len(prompt) + NEW_TOKENS > 3 * 32  # past Gemma 4's sliding window, several times
        plain = LocalBackend(loaded, load_once.vocabulary(tokenizer))
        truth = [e["id"] for e in tokens(collect(plain, DecodeRequest(prompt, NEW_TOKENS, sampling, frozenset())))]
        asyncio.run(plain.close())
        assert len(truth) == NEW_TOKENS

        oracles = []

        class Drafted(Drafting):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                self.lookup = Oracle(prompt, truth, {0: 2, 1: None, 2: 0, 3: 1, 4: None})
                oracles.append(self.lookup)

        monkeypatch.setattr(local_module, "Drafting", Drafted)
        spec = LocalBackend(loaded, load_once.vocabulary(tokenizer), speculative=NGRAM)
        events = collect(spec, DecodeRequest(prompt, NEW_TOKENS, sampling, frozenset()))
        asyncio.run(spec.close())
        got = tokens(events)
        assert [e["id"] for e in got] == truth
        marks = "".join("." if not e["drafted"] else "A" if e["accepted"] else "x" for e in got)
        assert "AAx" in marks and ".x" in marks and "AAAA." in marks, marks  # mid-way, first, all accepted
        done = events[-1]
        assert done["finish_reason"] == "length" and done["drafts"] == oracles[0].proposals
        assert done["drafted"] >= marks.count("A") + marks.count("x") and done["accepted"] == marks.count("A")


    def test_max_tokens_and_stops_hold_inside_a_verified_run(self, model, monkeypatch):
        # A run of accepted drafts is emitted token by token: max_tokens ends it exactly, and a stop
        # token among the drafts ends the generation there.
        _, tokenizer, loaded = model
        prompt = prompt_of(tokenizer)
        greedy = SamplingParams(temperature=0)
        plain = LocalBackend(loaded, load_once.vocabulary(tokenizer))
        truth = [e["id"] for e in tokens(collect(plain, DecodeRequest(prompt, 24, greedy, frozenset())))]
        asyncio.run(plain.close())

        class Drafted(Drafting):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                self.lookup = Oracle(prompt, truth, {0: None})

        monkeypatch.setattr(local_module, "Drafting", Drafted)
        spec = LocalBackend(loaded, load_once.vocabulary(tokenizer), speculative=NGRAM)
        for limit in (1, 2, 7):
            got = tokens(collect(spec, DecodeRequest(prompt, limit, greedy, frozenset())))
            assert [e["id"] for e in got] == truth[:limit]
        stop = truth[9]
        first = truth.index(stop)
        events = collect(spec, DecodeRequest(prompt, 24, greedy, frozenset({stop})))
        assert [e["id"] for e in tokens(events)] == truth[:first + 1] and events[-1]["finish_reason"] == "stop"
        asyncio.run(spec.close())


    def test_sampling_runs_with_marks_and_counts(self, model, monkeypatch):
        # Sampling verifies by speculative sampling (its distribution: test_speculative_sampling.py).
        _, tokenizer, loaded = model
        prompt = prompt_of(tokenizer)
        sampled = SamplingParams(temperature=0.8, top_p=0.9, top_k=40, seed=7)
        plain = LocalBackend(loaded, load_once.vocabulary(tokenizer))
        truth = [e["id"] for e in tokens(collect(plain, DecodeRequest(prompt, 32, sampled, frozenset())))]
        asyncio.run(plain.close())

        class Drafted(Drafting):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                self.lookup = Oracle(prompt, truth, {0: None, 1: 1})

        monkeypatch.setattr(local_module, "Drafting", Drafted)
        spec = LocalBackend(loaded, load_once.vocabulary(tokenizer), speculative=NGRAM)
        events = collect(spec, DecodeRequest(prompt, 32, sampled, frozenset()))
        asyncio.run(spec.close())
        got = tokens(events)
        assert len(got) == 32 and events[-1]["drafted"] > 0
        assert events[-1]["accepted"] == sum(e["accepted"] for e in got)
        for e in got:  # the report is the target's own distribution at T = 1
            assert e["top_logprobs"][0] >= e["logprob"] - 1e-6 and e["rank"] >= 1
