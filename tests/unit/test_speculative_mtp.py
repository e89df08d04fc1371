"""method mtp (issue 29): the checkpoints' own drafters on the local backend, lossless.

Qwen3.5's MTP layer (its mtp.* weights, read from the checkpoint's safetensors) and a Gemma 4
assistant (Gemma4AssistantForCausalLM, reading the model's keys and values), on the tiny test
checkpoints with random drafter weights of the real layout (tiny_qwen3_5.qwen3_5_mtp_checkpoint,
tiny_gemma4.gemma4_assistant_checkpoint). Three things are shown for each:

- what the drafter guesses is what it should: each proposal's first guess equals the drafter run
  another way, over one full forward pass of the model (support/mtp_checks.py), to within rounding;
  feeding it the wrong hidden state, or not rolling back what a rejected draft left, moves the
  guesses by a hundred times more;
- greedy output is plain decoding's, token for token, with drafts accepted and rejected (the
  drafter fitted to the model's own output on part of the answer), and sampling runs by the
  verification rule (why equality holds on any CPU: tests/support/speculative_checks.py);
- a wrong rollback of the model's own state (Qwen3.5's Gated DeltaNet) changes the output.
"""

from __future__ import annotations

import pytest
import torch
from mtp_checks import (
    FirstGuesses,
    fit_gemma,
    fit_qwen,
    gemma_reference,
    marks,
    plain_ids,
    qwen_reference,
    speculate,
    tokens,
)
from transformers import AutoModelForCausalLM

from looptrace.backends.speculative import drafting as speculative, mtp_gemma4, mtp_qwen3_5
from looptrace.backends.base import SamplingParams

import load_once
from build_cache import MissingPackage, MissingShared
from speculative_checks import RuleScores, assert_verified_as_plain

NEW_TOKENS = 48
# How far a first guess may be from the reference's: the same sums in another order. Qwen3.5's hidden
# states come from the verification passes (its chunked Gated DeltaNet) against one full pass: 4e-4 at
# most measured; a wrong hidden state or a rollback missed moves a guess by 0.1 and more. Gemma 4's
# plain attention: a few 1e-6 against 2e-3 and more.
QWEN_ROUNDING = 5e-3
GEMMA_ROUNDING = 1e-4


@pytest.fixture(scope="module")
def qwen():
    import tiny_qwen3_5

    try:
        folder = tiny_qwen3_5.qwen3_5_mtp_checkpoint()
    except (MissingPackage, MissingShared) as exc:  # as conftest's fixtures say it
        pytest.skip(str(exc))
    tokenizer = load_once.tokenizer(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return folder, tokenizer, model


@pytest.fixture(scope="module")
def gemma(gemma4_dir):
    import tiny_gemma4

    tokenizer = load_once.tokenizer(gemma4_dir)
    model = AutoModelForCausalLM.from_pretrained(gemma4_dir, dtype=torch.float32).eval()
    return tiny_gemma4.gemma4_assistant_checkpoint(), tokenizer, model


def prompt_of(tokenizer) -> list[int]:
    text = "Copy this list back: apples, pears, plums, cherries, apples, pears, figs. " * 3
    return tokenizer(text, add_special_tokens=False)["input_ids"]


# -- Qwen3.5: the MTP layer --

def test_the_mtp_layer_is_the_checkpoints_mtp_tensors(qwen):
    from safetensors import safe_open

    folder, _, model = qwen
    drafting = mtp_qwen3_5.load_qwen3_5_mtp(folder, model)
    with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:
        stored = {k.removeprefix("mtp."): handle.get_tensor(k) for k in handle.keys() if k.startswith("mtp.")}
    ours = drafting.mtp.state_dict()
    assert set(ours) == set(stored) and len(stored) == 15
    assert all(torch.equal(ours[name], stored[name]) for name in stored)
    assert drafting.tokens == 1  # one MTP layer: one draft a pass unless told otherwise


def test_a_checkpoint_without_mtp_weights_is_refused(qwen3_5_dir):
    model = AutoModelForCausalLM.from_pretrained(qwen3_5_dir, dtype=torch.float32).eval()
    with pytest.raises(ValueError, match="no mtp.\\* weights"):
        mtp_qwen3_5.load_qwen3_5_mtp(qwen3_5_dir, model)


def qwen_guess_errors(qwen, monkeypatch, drafter_class=mtp_qwen3_5.MTPDrafter) -> list[float]:
    """For each proposal of a greedy decode, how far its first guess is from the layer's over the whole
    sequence (the largest logit difference)."""
    folder, tokenizer, model = qwen
    drafting = mtp_qwen3_5.load_qwen3_5_mtp(folder, model)
    guesses = FirstGuesses(monkeypatch, drafter_class)
    monkeypatch.setattr(mtp_qwen3_5, "MTPDrafter", drafter_class)
    prompt = prompt_of(tokenizer)
    events = speculate(model, tokenizer, drafting, prompt, NEW_TOKENS, drafts=3)
    ids = prompt + [e["id"] for e in tokens(events)]
    reference = qwen_reference(model, drafting, ids)
    assert len(guesses.seen) > 5
    errors = [float((logits - reference[length - 2]).abs().max()) for length, logits in guesses.seen]
    print(f"{drafter_class.__name__}: first guesses off by " + ", ".join(f"{e:.1e}" for e in errors))
    return errors


def test_each_first_guess_is_the_layer_fed_the_models_hidden_state_and_the_next_token(qwen, monkeypatch):
    assert max(qwen_guess_errors(qwen, monkeypatch)) < QWEN_ROUNDING


class ShiftedHidden(mtp_qwen3_5.MTPDrafter):
    """A mutation: the hidden state of the position after (the wrong one) fed at each position."""

    def propose(self, count):
        self.pending.extend(self.tap.take())
        if self.pending:
            rows = torch.cat(self.pending)
            self.pending = [torch.cat((rows[1:], rows[-1:]))]
        return super().propose(count)


class NoRollback(mtp_qwen3_5.MTPDrafter):
    """A mutation: the layer's own guesses left in its cache after a verification."""

    def verified(self, accepted):
        self.guessed = 0
        super().verified(accepted)


@pytest.mark.parametrize("mutant", [ShiftedHidden, NoRollback], ids=["wrong hidden state", "no rollback"])
def test_a_wrong_hidden_state_or_rollback_is_caught(qwen, monkeypatch, mutant):
    matches = [error < QWEN_ROUNDING for error in qwen_guess_errors(qwen, monkeypatch, mutant)]
    assert not all(matches)
    if mutant is NoRollback:  # right until a rejected guess is left behind
        assert matches[0]


def test_qwen_greedy_output_is_plain_decodings_with_drafts_accepted_and_rejected(qwen, monkeypatch):
    folder, tokenizer, model = qwen
    prompt = prompt_of(tokenizer)
    scores = RuleScores(monkeypatch)
    truth = plain_ids(model, tokenizer, prompt, NEW_TOKENS)
    plain_scores = scores.take()
    drafting = mtp_qwen3_5.load_qwen3_5_mtp(folder, model)
    fit_qwen(model, drafting, prompt + truth, len(prompt) + NEW_TOKENS // 2)  # guesses right for half the answer
    events = speculate(model, tokenizer, drafting, prompt, NEW_TOKENS, drafts=3)
    assert_verified_as_plain(plain_scores, scores.take(), truth, [e["id"] for e in tokens(events)])
    pattern = marks(events)
    assert pattern.count("A") >= 8 and "x" in pattern, pattern
    assert events[-1]["draft_method"] == "mtp" and {e["draft_method"] for e in tokens(events) if e["drafted"]} == {"mtp"}
    assert events[-1]["accepted"] == pattern.count("A")
    sampled = speculate(model, tokenizer, drafting, prompt, 24, drafts=3,
                        sampling=SamplingParams(temperature=0.8, top_k=40, seed=5))
    assert len(tokens(sampled)) == 24 and sampled[-1]["drafted"] > 0


def test_a_wrong_rollback_of_the_models_own_state_changes_the_output(qwen, monkeypatch):
    # The Gated DeltaNet state must be put back when a draft is rejected: without it the scores the
    # verification reads are far from plain decoding's, and the check above fails.
    folder, tokenizer, model = qwen
    prompt = prompt_of(tokenizer)
    scores = RuleScores(monkeypatch)
    truth = plain_ids(model, tokenizer, prompt, NEW_TOKENS)
    plain_scores = scores.take()
    drafting = mtp_qwen3_5.load_qwen3_5_mtp(folder, model)
    fit_qwen(model, drafting, prompt + truth, len(prompt) + NEW_TOKENS // 2)
    monkeypatch.setattr(speculative.Rollback, "before", lambda self: None)
    monkeypatch.setattr(speculative.Rollback, "after", lambda self, fed, kept: [layer.crop(kept - fed)
                                                                              for layer in self.attention] and None)
    events = speculate(model, tokenizer, drafting, prompt, NEW_TOKENS, drafts=3)
    with pytest.raises(AssertionError, match="the verification's scores differ"):
        assert_verified_as_plain(plain_scores, scores.take(), truth, [e["id"] for e in tokens(events)])


# -- Gemma 4: the assistant --

def test_the_assistant_is_refused_beside_another_model(gemma, qwen):
    assistant, _, _ = gemma
    _, _, other = qwen  # the same hidden size, another vocabulary
    with pytest.raises(ValueError, match="another vocabulary"):
        mtp_gemma4.load_gemma4_assistant(assistant, other)


def gemma_guesses_match(gemma, monkeypatch, drafter_class=mtp_gemma4.AssistantDrafter) -> list[bool]:
    folder, tokenizer, model = gemma
    drafting = mtp_gemma4.load_gemma4_assistant(folder, model)
    assert drafting.tokens == 6 and drafting.assistant.config.use_ordered_embeddings
    prompt = prompt_of(tokenizer)
    # Fitted to guess right for part of the answer: a proposal follows a verification directly only
    # after a draft stood (else drafting pauses, and a plain step's state comes first), and a draft
    # rejected after others stood leaves the state a wrong rollback would keep.
    start = len(prompt) - 2
    fit_gemma(model, drafting, prompt + plain_ids(model, tokenizer, prompt, NEW_TOKENS), start, start + NEW_TOKENS // 2)
    guesses = FirstGuesses(monkeypatch, drafter_class)
    monkeypatch.setattr(mtp_gemma4, "AssistantDrafter", drafter_class)
    events = speculate(model, tokenizer, drafting, prompt, NEW_TOKENS, drafts=3)
    assert "Ax" in marks(events), marks(events)
    ids = prompt + [e["id"] for e in tokens(events)]
    assert len(guesses.seen) > 5 and len(prompt) + NEW_TOKENS > 3 * 32  # well past the sliding window
    errors = [float((logits - gemma_reference(model, drafting, ids[:length])).abs().max())
              for length, logits in guesses.seen]
    print(f"{drafter_class.__name__}: first guesses off by " + ", ".join(f"{e:.1e}" for e in errors))
    return [error < GEMMA_ROUNDING for error in errors]


def test_each_first_guess_reads_the_models_keys_values_and_hidden_state(gemma, monkeypatch):
    assert all(gemma_guesses_match(gemma, monkeypatch))


class LastRowHidden(mtp_gemma4.AssistantDrafter):
    """A mutation: the hidden state of the pass's last position, whether or not its draft stood."""

    def verified(self, accepted):
        chunk = self.hidden_tap.chunks[-1]
        super().verified(accepted)
        self.hidden = chunk[-1:][None]


class RejectedKeysKept(mtp_gemma4.AssistantDrafter):
    """A mutation: the keys and values of rejected drafts left where the assistant reads them."""

    def verified(self, accepted):
        super().verified(accepted)
        self.shared = dict(self.kv_tap.states)


@pytest.mark.parametrize("mutant", [LastRowHidden, RejectedKeysKept], ids=["wrong hidden state", "no rollback"])
def test_a_wrong_assistant_state_is_caught(gemma, monkeypatch, mutant):
    matches = gemma_guesses_match(gemma, monkeypatch, mutant)
    assert matches[0] and not all(matches)  # right after prefill, wrong once a verification went by


def test_gemma_greedy_output_is_plain_decodings_with_drafts_accepted_and_rejected(gemma, monkeypatch):
    folder, tokenizer, model = gemma
    prompt = prompt_of(tokenizer)
    scores = RuleScores(monkeypatch)
    truth = plain_ids(model, tokenizer, prompt, NEW_TOKENS)
    plain_scores = scores.take()
    drafting = mtp_gemma4.load_gemma4_assistant(folder, model)
    start = len(prompt) - 2
    fit_gemma(model, drafting, prompt + truth, start, start + NEW_TOKENS // 2)
    events = speculate(model, tokenizer, drafting, prompt, NEW_TOKENS, drafts=3)
    assert_verified_as_plain(plain_scores, scores.take(), truth, [e["id"] for e in tokens(events)])
    pattern = marks(events)
    assert pattern.count("A") >= 8 and "x" in pattern, pattern
    sampled = speculate(model, tokenizer, drafting, prompt, 24, drafts=3,
                        sampling=SamplingParams(temperature=0.8, top_k=40, seed=5))
    assert len(tokens(sampled)) == 24 and sampled[-1]["drafted"] > 0
