"""Speculative decoding on the local backend (issue 15): lossless, and traced token by token.

Prompt lookup's verification and rollback are checked with an oracle drafter (tests/support/speculative_checks.py):
it proposes the plain decoder's own next tokens with mistakes put in on purpose (a rejection mid-way, a
first draft wrong, all right), so every path runs on every architecture: here the tiny Qwen3.5 (its Gated
DeltaNet state put back and the accepted tokens run again) and the tiny Gemma 4 well past its 32-token
sliding window; SmolLM2 (plain attention, a real model) in tests/integration/test_speculative_smollm2.py. Greedy
output must be the plain decoder's token for token. Prompt lookup itself, on real copying, is checked end
to end with SmolLM2 (tests/integration/test_speculative_serving.py). A draft model is checked with the
tiny model drafting for itself, its weights nudged so that it mostly agrees: its own cache is cut back too.
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import AutoModelForCausalLM

from looptrace.backends.base import DecodeRequest, SamplingParams
from looptrace.backends.local import backend as local_module
from looptrace.backends.local.backend import LocalBackend
from looptrace.backends.speculative.drafting import Backoff, Drafting, PromptLookup, SpeculativeConfig

import load_once
from speculative_checks import (
    NEW_TOKENS,
    NGRAM,
    Oracle,
    RuleScores,
    VerifiedDecodingChecks,
    assert_verified_as_plain,
    collect,
    prompt_of,
    tokens,
)


@pytest.fixture(scope="module", params=["qwen3_5", "gemma4"])
def model(request):
    folder = request.getfixturevalue(f"{request.param}_dir")
    tokenizer = load_once.tokenizer(folder)
    loaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return request.param, tokenizer, loaded


class TestTinyModels(VerifiedDecodingChecks):
    """The tiny Qwen3.5 and Gemma 4."""


# -- the parts, on their own --

def test_prompt_lookup_proposes_what_followed_the_latest_match():
    lookup = PromptLookup([1, 2, 3, 4, 9, 1, 2, 3, 5, 6], low=1, high=3)
    for token in (1, 2, 3):
        lookup.append(token)
    assert lookup.propose(2) == [5, 6]  # [1, 2, 3] last ended before 5, 6 (the earlier one before 4, 9)
    lookup.append(7)
    assert lookup.propose(3) == []  # 7 never came before
    lookup.append(1)
    assert lookup.propose(3) == [2, 3, 7]  # the longest match wins, and may run into the output itself


def test_backoff_pauses_after_failures_and_never_shortens():
    backoff = Backoff(4)
    assert backoff.next_length() == 4
    backoff.record(1)
    assert backoff.next_length() == 4  # a partial acceptance: a shorter pass would cost as much
    backoff.record(0)
    assert [backoff.next_length() for _ in range(2)] == [0, 4]
    backoff.record(0)
    assert [backoff.next_length() for _ in range(3)] == [0, 0, 4]
    backoff.record(4)  # a success ends the run of failures
    backoff.record(0)
    assert [backoff.next_length() for _ in range(2)] == [0, 4]
    for _ in range(10):
        backoff.record(0)
    assert [backoff.next_length() for _ in range(65)] == [0] * 64 + [4]  # at most 64 steps without drafting


def test_a_rollback_puts_back_the_length_that_places_the_next_tokens(qwen3_5_dir):
    # transformers 5.25 counts on each linear-attention layer the tokens it has read, and the cache's
    # length, which gives the next token its position, is read from the first layer: a linear one in
    # Qwen3.5. A rollback that put back the Gated DeltaNet state but not that count left every later
    # rotary position ahead by the rejected drafts, and the verified output drifted from plain decoding's.
    from looptrace.backends.speculative.drafting import Rollback

    tokenizer = load_once.tokenizer(qwen3_5_dir)
    model = AutoModelForCausalLM.from_pretrained(qwen3_5_dir, dtype=torch.float32).eval()
    prompt = prompt_of(tokenizer)
    last, drafts, following = prompt[-1], prompt[:3], prompt[3]  # what the tokens are does not matter here
    with torch.inference_mode():
        cache = model(input_ids=torch.tensor([prompt[:-1]]), use_cache=True).cache
        rollback = Rollback(cache)
        rollback.before()
        model(input_ids=torch.tensor([[last, *drafts]]), cache=cache, use_cache=True)  # a verification pass
        assert rollback.after(4, 2) == 2  # `last` and one draft stand: the DeltaNet state is put back
        model(input_ids=torch.tensor([[last, drafts[0]]]), cache=cache, use_cache=True)  # they go in again
        assert cache.get_seq_length() == len(prompt) + 1
        got = model(input_ids=torch.tensor([[following]]), cache=cache, use_cache=True).logits[0, -1]
        fresh = model(input_ids=torch.tensor([[*prompt, drafts[0], following]])).logits[0, -1]
    # The same tokens at the same positions, run in other pieces: equal but for float32 rounding (1e-5
    # here); positions four ahead (the pass left counted) move them by tenths.
    difference = float((got - fresh).abs().max())
    print(f"largest logit difference from a fresh run: {difference:.2e}")
    assert difference < 1e-3


@pytest.mark.parametrize(("text", "says"), [
    ("{", "not JSON"), ("[]", "JSON object"), ('{"method": "eagle", "num_speculative_tokens": 2}', "method"),
    ('{"method": "ngram"}', "num_speculative_tokens"), ('{"method": "ngram", "num_speculative_tokens": 2, "x": 1}',
                                                        "x not understood"),
    ('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2}', "min <= max"),
    ('{"method": "ngram", "num_speculative_tokens": 2, "suffix_decoding_max_tree_depth": 8}', "is for method suffix"),
    ('{"method": "suffix", "suffix_decoding_min_token_prob": 2}', "min_token_prob must be a number from 0 to 1"),
    ('{"method": "suffix", "suffix_decoding_max_tree_depth": 0}', "max_tree_depth must be an integer from 1"),
    ('{"method": "mtp", "num_speculative_tokens": 0}', "num_speculative_tokens"),
    ('{"method": "draft_model", "num_speculative_tokens": 1}', "needs a model"),
    ('{"method": "ngram", "num_speculative_tokens": 2, "draft_length": "long"}', "measured or fixed"),
])
def test_a_bad_config_says_what_is_wrong(text, says):
    with pytest.raises(ValueError, match=says):
        SpeculativeConfig.parse(text)


def test_vllms_defaults():
    assert SpeculativeConfig.parse('{"method": "ngram", "num_speculative_tokens": 3}').prompt_lookup_min == 5
    config = SpeculativeConfig.parse('{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}')
    assert (config.prompt_lookup_min, config.prompt_lookup_max) == (4, 4)
    suffix = SpeculativeConfig.parse('{"method": "suffix"}')  # vLLM's: the tree depth is the draft length
    assert (suffix.num_speculative_tokens, suffix.suffix_decoding_max_tree_depth, suffix.suffix_decoding_max_cached_requests,
            suffix.suffix_decoding_max_spec_factor, suffix.suffix_decoding_min_token_prob) == (24, 24, 10000, 1.0, 0.1)
    assert SpeculativeConfig.parse('{"method": "mtp"}').num_speculative_tokens is None  # the checkpoint's own count
    assert config.draft_length == "measured" and "draft_length" not in config.described()
    fixed = SpeculativeConfig.parse('{"method": "ngram", "num_speculative_tokens": 3, "draft_length": "fixed"}')
    assert fixed.described()["draft_length"] == "fixed"


def test_mtp_is_refused_for_a_model_without_a_drafter_of_its_own():
    from looptrace.backends.speculative.drafters import mtp_loader
    from looptrace.common.checkpoint import Checkpoint

    config = SpeculativeConfig.parse('{"method": "mtp"}')
    with pytest.raises(ValueError, match="this model \\(llama\\) has neither"):
        mtp_loader(Checkpoint("x", None, {"model_type": "llama"}), config)
    with pytest.raises(ValueError, match="google/gemma-4-E2B-it-assistant"):  # Gemma 4's drafter is a checkpoint
        mtp_loader(Checkpoint("x", None, {"model_type": "gemma4"}), config)
    with pytest.raises(ValueError, match="leave out model"):  # Qwen3.5's is in its own
        mtp_loader(Checkpoint("x", None, {"model_type": "qwen3_5_moe"}),
                   SpeculativeConfig.parse('{"method": "mtp", "model": "other"}'))


def test_every_drafter_in_the_table_loads_from_where_it_says():
    """As the backend registry's entries: each row's loader is a function its module defines, and no
    model type has two drafters."""
    import importlib

    from looptrace.backends.speculative.drafters import DRAFTERS

    kinds = [kind for drafter in DRAFTERS for kind in drafter.model_types]
    assert len(kinds) == len(set(kinds))
    for drafter in DRAFTERS:
        module, _, function = drafter.loader.partition(":")
        assert callable(getattr(importlib.import_module(module), function)), drafter.loader


# -- draft_model: a smaller model drafts; here the tiny model with its weights slightly moved --

DRAFTING = SpeculativeConfig.parse('{"method": "draft_model", "model": "drafter", "num_speculative_tokens": 4}')


def nudged(folder, scale: float = 0.01):
    """The checkpoint with every matrix moved by `scale` of its spread: a drafter that mostly agrees."""
    drafter = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for weight in drafter.parameters():
            if weight.dim() > 1:
                weight.add_(torch.randn(weight.shape, generator=generator) * weight.std() * scale)
    return drafter


@pytest.mark.parametrize("family", ["qwen3_5", "gemma4"])
def test_a_draft_model_drafts_and_the_output_is_the_plain_decoders(request, family, monkeypatch):
    folder = request.getfixturevalue(f"{family}_dir")
    tokenizer = load_once.tokenizer(folder)
    target = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prompt = prompt_of(tokenizer)
    greedy = SamplingParams(temperature=0)
    scores = RuleScores(monkeypatch)  # why the output must be equal: speculative_checks.py
    plain = LocalBackend(target, load_once.vocabulary(tokenizer))
    truth = [e["id"] for e in tokens(collect(plain, DecodeRequest(prompt, NEW_TOKENS, greedy, frozenset())))]
    asyncio.run(plain.close())
    plain_scores = scores.take()
    spec = LocalBackend(target, load_once.vocabulary(tokenizer), speculative=DRAFTING, drafter=nudged(folder))
    events = collect(spec, DecodeRequest(prompt, NEW_TOKENS, greedy, frozenset()))
    got = tokens(events)
    assert_verified_as_plain(plain_scores, scores.take(), truth, [e["id"] for e in got])
    marks = "".join("." if not e["drafted"] else "A" if e["accepted"] else "x" for e in got)
    assert "AAAA." in marks and "Ax" in marks, marks  # whole drafts stood, others were cut mid-way
    assert events[-1]["accepted"] == marks.count("A")
    # Sampling: drafts drawn from the drafter's q, corrected to the target's p.
    sampled = collect(spec, DecodeRequest(prompt, 32, SamplingParams(temperature=0.9, top_k=50, seed=3), frozenset()))
    assert len(tokens(sampled)) == 32 and sampled[-1]["drafted"] > 0
    asyncio.run(spec.close())


# -- suffix: drafts from this conversation's earlier turns, through the same verification --

SUFFIX = SpeculativeConfig.parse('{"method": "suffix", "num_speculative_tokens": 8}')


@pytest.mark.parametrize("family", ["qwen3_5", "gemma4"])
def test_suffix_decoding_over_a_conversations_turns_gives_the_plain_decoders_output(request, family, monkeypatch):
    # Each turn's prompt holds the turns before it and their answers, as an agent's does. The tiny
    # Qwen3.5 answers the second turn with its first answer again, which suffix decoding drafts from
    # the first turn, whole drafts standing; Gemma 4's answers repeat less, drafted where they do.
    folder = request.getfixturevalue(f"{family}_dir")
    tokenizer = load_once.tokenizer(folder)
    target = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    greedy = SamplingParams(temperature=0)
    first = prompt_of(tokenizer)
    scores = RuleScores(monkeypatch)  # why the output must be equal: speculative_checks.py
    plain = LocalBackend(target, load_once.vocabulary(tokenizer))
    prompts, truths, plain_scores = [], [], []
    for more in (first, first, first[:20]):  # the user's next message
        prompts.append([*prompts[-1], *truths[-1], *more] if prompts else more)
        truths.append([e["id"] for e in tokens(collect(plain, DecodeRequest(prompts[-1], 40, greedy, frozenset())))])
        plain_scores.append(scores.take())
    asyncio.run(plain.close())
    spec = LocalBackend(target, load_once.vocabulary(tokenizer), speculative=SUFFIX)
    turns = []
    for prompt, truth, rows in zip(prompts, truths, plain_scores):
        turns.append(collect(spec, DecodeRequest(prompt, 40, greedy, frozenset(), conversation="c")))
        assert_verified_as_plain(rows, scores.take(), truth, [e["id"] for e in tokens(turns[-1])])
    assert spec.health_details()["drafting"]["kept"]["sequences"] == 1  # each turn extended the one before's
    asyncio.run(spec.close())
    marks = ["".join("." if not e["drafted"] else "A" if e["accepted"] else "x" for e in tokens(events))
             for events in turns]
    assert all(events[-1]["draft_method"] == "suffix" for events in turns)
    assert sum(events[-1]["accepted"] for events in turns) == sum(m.count("A") for m in marks) > 0, marks
    if family == "qwen3_5":
        assert "AAAAAAAA" in marks[1], marks


def test_a_draft_model_with_another_tokenizer_is_refused(qwen3_5_dir, gemma4_dir):
    from looptrace.backends.local.loading import same_tokenizer
    from looptrace.common.checkpoint import read_config

    qwen_tokenizer = load_once.tokenizer(qwen3_5_dir)  # loaded once: seconds for its real vocabulary
    same_tokenizer(read_config(str(qwen3_5_dir)), qwen_tokenizer)
    with pytest.raises(ValueError, match="another tokenizer"):
        same_tokenizer(read_config(str(gemma4_dir)), qwen_tokenizer)


def test_a_prompt_with_an_image_verifies_as_plain_decoding(qwen3_5_dir, monkeypatch):
    # Qwen3.5 keeps the image's rope offset on the model: verification passes must read positions as
    # plain steps do.
    import json

    from PIL import Image
    from transformers import AutoModelForImageTextToText

    from looptrace.families import family_for_config
    from looptrace.families.media.processor import load_processor

    from tiny_media import with_images

    folder = with_images(qwen3_5_dir, "qwen3_5")
    tokenizer = load_once.tokenizer(folder)
    family_cls = family_for_config(json.loads((folder / "config.json").read_text()))
    family = family_cls(tokenizer, processor=load_processor(folder, family_cls.processor_class, tokenizer, {}))
    rendered = family.render([{"role": "user", "content": [
        {"type": "text", "text": "What is this?"}, {"type": "image", "image": Image.new("RGB", (64, 48), (200, 30, 30))}]}],
        None, False)
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval()
    greedy = SamplingParams(temperature=0)

    def request():
        return DecodeRequest(rendered.ids, 40, greedy, frozenset(), media=rendered.media)

    scores = RuleScores(monkeypatch)  # why the output must be equal: speculative_checks.py
    plain = LocalBackend(model, load_once.vocabulary(tokenizer))
    truth = [e["id"] for e in tokens(collect(plain, request()))]
    asyncio.run(plain.close())
    plain_scores = scores.take()

    class Drafted(Drafting):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.lookup = Oracle(rendered.ids, truth, {0: 2, 1: None})

    monkeypatch.setattr(local_module, "Drafting", Drafted)
    spec = LocalBackend(model, load_once.vocabulary(tokenizer), speculative=NGRAM)
    events = collect(spec, request())
    asyncio.run(spec.close())
    assert_verified_as_plain(plain_scores, scores.take(), truth, [e["id"] for e in tokens(events)])
    assert events[-1]["accepted"] > 10
