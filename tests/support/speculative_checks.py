"""Speculative decoding's checks on one model, run on every architecture: the local backend's verified
output is the plain decoder's, token for token (tests/unit/test_speculative.py runs them on the tiny
Qwen3.5 and Gemma 4, tests/integration/test_speculative_smollm2.py on SmolLM2).

Prompt lookup's verification and rollback are checked with an oracle drafter: it proposes the plain
decoder's own next tokens with mistakes put in on purpose (a rejection mid-way, a first draft wrong, all
right), so every path runs.

Why greedy output must be equal, on any CPU: a verification pass gives the rule (sampling.py) the scores a
plain step gives it at the same position, to within rounding (the same sums in another order), and at every
position the plain decoder's winner leads by more than twice the largest such difference (with headroom for
another CPU's rounding), so no rounding can pick another token. `assert_verified_as_plain` checks both
(RuleScores records what the rule was given) and prints them: only a near-tie of the model could break
equality, and a near-tie fails the check by name rather than as a token that differs.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from looptrace.backends.base import DecodeRequest, SamplingParams
from looptrace.backends.local import backend as local_module
from looptrace.backends.local.backend import LocalBackend
from looptrace.backends.speculative import drafting as drafting_module
from looptrace.backends.speculative.drafting import Drafting, SpeculativeConfig

import load_once

NGRAM = SpeculativeConfig.parse('{"method": "ngram", "num_speculative_tokens": 4}')


# Gemma 4's tiny model has a near-tie at its 56th token after prompt_of (a lead of 3e-5): stopped before it.
NEW_TOKENS = 48


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


# How far a verification pass's scores may be from a plain step's at the same position: the same sums in
# another order (a pass of several tokens against one-token steps; Qwen3.5's chunked Gated DeltaNet against
# its recurrent form, the most: 2e-3 at one token of the image prompt) differ by 1e-5 to 2e-3 in float32 on
# the CPUs measured; a wrong state moves them by tenths (0.19 to 0.63 for a rollback that left positions ahead).
ROUNDING = 1e-2
# The winner must lead by more than twice the largest difference seen, times this: another CPU's rounding
# several times this one's still could not pick another token.
HEADROOM = 4


class RuleScores:
    """The scores each choice of the target compared (its logits less the penalties' offsets), one row a
    token in the order they were chosen: recorded where the local backend and the verification call the
    rule (a drafter's own choices are not)."""

    def __init__(self, monkeypatch) -> None:
        self.rows: list[torch.Tensor] = []
        for module, name in ((local_module, "next_token"), (drafting_module, "next_token"),
                             (drafting_module, "verified_token")):
            monkeypatch.setattr(module, name, self._recording(getattr(module, name)))

    def _recording(self, rule):
        def recorded(logits, params, generator, penalties=None, *more):
            self.rows.append(logits - penalties.offsets if penalties is not None else logits.clone())
            return rule(logits, params, generator, penalties, *more)

        return recorded

    def take(self) -> list[torch.Tensor]:
        """The rows recorded since the last take."""
        rows, self.rows = self.rows, []
        return rows


def leads(rows: list[torch.Tensor]) -> list[float]:
    """How far each row's highest score is ahead of the next: a greedy choice's margin."""
    return [float(top[0] - top[1]) for top in (row.topk(2).values for row in rows)]


def assert_verified_as_plain(plain: list[torch.Tensor], verified: list[torch.Tensor], truth: list[int],
                             got: list[int]) -> None:
    """Greedy output with drafts verified is plain decoding's, for the reason the module's docstring gives:
    `plain` and `verified` are the two runs' RuleScores rows, `truth` and `got` their tokens."""
    assert len(plain) >= len(truth) and len(verified) >= len(got)
    # Compared up to the first token that differs: past it the two runs read different sequences.
    upto = next((i + 1 for i, (a, b) in enumerate(zip(truth, got)) if a != b), min(len(truth), len(got)))
    differences = [float((a - b).abs().max()) for a, b in zip(plain[:upto], verified[:upto])]
    margins = leads(plain[:len(truth)])
    far, low = max(range(upto), key=differences.__getitem__), min(range(len(truth)), key=margins.__getitem__)
    print(f"largest difference from plain decoding's scores {differences[far]:.2e} (token {far}); "
          f"smallest lead of the winner {margins[low]:.2e} (token {low})")
    assert differences[far] < ROUNDING, f"token {far}: the verification's scores differ by {differences[far]:.3g}"
    assert margins[low] > 2 * HEADROOM * differences[far], (
        f"token {low}: a near-tie (a lead of {margins[low]:.3g} against differences up to {differences[far]:.3g}), "
        "which rounding could flip")
    assert got == truth


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
        scores = RuleScores(monkeypatch)
        plain = LocalBackend(loaded, load_once.vocabulary(tokenizer))
        truth = [e["id"] for e in tokens(collect(plain, DecodeRequest(prompt, NEW_TOKENS, sampling, frozenset())))]
        asyncio.run(plain.close())
        assert len(truth) == NEW_TOKENS
        plain_scores = scores.take()

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
        assert_verified_as_plain(plain_scores, scores.take(), truth, [e["id"] for e in got])
        marks = "".join("." if not e["drafted"] else "A" if e["accepted"] else "x" for e in got)
        assert "AAx" in marks and ".x" in marks and "AAAA." in marks, marks  # mid-way, first, all accepted
        done = events[-1]
        assert done["finish_reason"] == "length" and done["drafts"] == oracles[0].proposals
        assert done["drafted"] >= marks.count("A") + marks.count("x") and done["accepted"] == marks.count("A")


    def test_max_tokens_and_stops_hold_inside_a_verified_run(self, model, monkeypatch):
        # A run of accepted drafts is emitted token by token: max_tokens ends it exactly, and a stop
        # token among the drafts ends the generation there. (Equal tokens: the first 24 of the prompt's
        # answer above, where the check of test_verified_output_is_the_plain_decoders says why.)
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
