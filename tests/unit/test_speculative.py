"""Speculative decoding on the local backend (issue 15): lossless, and traced token by token.

Prompt lookup's verification and rollback are checked with an oracle drafter (tests/support/speculative_checks.py):
it proposes the plain decoder's own next tokens with mistakes put in on purpose (a rejection mid-way, a
first draft wrong, all right), so every path runs on every architecture: here the tiny Qwen3.5 (its Gated
DeltaNet state put back and the accepted tokens run again) and the tiny Gemma 4 well past its 32-token
sliding window; SmolLM2 (plain attention, a real model) in tests/integration/test_speculative.py. Greedy
output must be the plain decoder's token for token. Prompt lookup itself, on real copying, is checked end
to end with SmolLM2 (tests/integration/test_speculative_serving.py). A draft model is checked with the
tiny model drafting for itself, its weights nudged so that it mostly agrees: its own cache is cut back too.
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from looptrace.backends import local as local_module
from looptrace.backends.base import DecodeRequest, SamplingParams
from looptrace.backends.local import LocalBackend
from looptrace.backends.speculative import Backoff, Drafting, PromptLookup, SpeculativeConfig
from looptrace.common.vocabulary import Vocabulary

from speculative_checks import NEW_TOKENS, NGRAM, Oracle, VerifiedDecodingChecks, collect, prompt_of, tokens


@pytest.fixture(scope="module", params=["qwen3_5", "gemma4"])
def model(request):
    folder = request.getfixturevalue(f"{request.param}_dir")
    tokenizer = AutoTokenizer.from_pretrained(folder)
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


@pytest.mark.parametrize(("text", "says"), [
    ("{", "not JSON"), ("[]", "JSON object"), ('{"method": "eagle", "num_speculative_tokens": 2}', "method"),
    ('{"method": "ngram"}', "num_speculative_tokens"), ('{"method": "ngram", "num_speculative_tokens": 2, "x": 1}',
                                                        "x not understood"),
    ('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2}', "min <= max"),
    ('{"method": "mtp", "num_speculative_tokens": 1}', "MTP head"),
    ('{"method": "draft_model", "num_speculative_tokens": 1}', "needs a model"),
])
def test_a_bad_config_says_what_is_wrong(text, says):
    with pytest.raises(ValueError, match=says):
        SpeculativeConfig.parse(text)


def test_vllms_defaults():
    assert SpeculativeConfig.parse('{"method": "ngram", "num_speculative_tokens": 3}').prompt_lookup_min == 5
    config = SpeculativeConfig.parse('{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}')
    assert (config.prompt_lookup_min, config.prompt_lookup_max) == (4, 4)


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
def test_a_draft_model_drafts_and_the_output_is_the_plain_decoders(request, family):
    folder = request.getfixturevalue(f"{family}_dir")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    target = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prompt = prompt_of(tokenizer)
    greedy = SamplingParams(temperature=0)
    plain = LocalBackend(target, Vocabulary(tokenizer))
    truth = [e["id"] for e in tokens(collect(plain, DecodeRequest(prompt, NEW_TOKENS, greedy, frozenset())))]
    asyncio.run(plain.close())
    spec = LocalBackend(target, Vocabulary(tokenizer), speculative=DRAFTING, drafter=nudged(folder))
    events = collect(spec, DecodeRequest(prompt, NEW_TOKENS, greedy, frozenset()))
    got = tokens(events)
    assert [e["id"] for e in got] == truth
    marks = "".join("." if not e["drafted"] else "A" if e["accepted"] else "x" for e in got)
    assert "AAAA." in marks and "Ax" in marks, marks  # whole drafts stood, others were cut mid-way
    assert events[-1]["accepted"] == marks.count("A")
    # Sampling: drafts drawn from the drafter's q, corrected to the target's p.
    sampled = collect(spec, DecodeRequest(prompt, 32, SamplingParams(temperature=0.9, top_k=50, seed=3), frozenset()))
    assert len(tokens(sampled)) == 32 and sampled[-1]["drafted"] > 0
    asyncio.run(spec.close())


def test_a_draft_model_with_another_tokenizer_is_refused(qwen3_5_dir, gemma4_dir):
    from looptrace.backends.loading import same_tokenizer
    from looptrace.common.checkpoint import read_config

    qwen_tokenizer = AutoTokenizer.from_pretrained(qwen3_5_dir)  # loaded once: seconds for its real vocabulary
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
    tokenizer = AutoTokenizer.from_pretrained(folder)
    family_cls = family_for_config(json.loads((folder / "config.json").read_text()))
    family = family_cls(tokenizer, processor=load_processor(folder, family_cls.processor_class, tokenizer, {}))
    rendered = family.render([{"role": "user", "content": [
        {"type": "text", "text": "What is this?"}, {"type": "image", "image": Image.new("RGB", (64, 48), (200, 30, 30))}]}],
        None, False)
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval()
    greedy = SamplingParams(temperature=0)

    def request():
        return DecodeRequest(rendered.ids, 40, greedy, frozenset(), media=rendered.media)

    plain = LocalBackend(model, Vocabulary(tokenizer))
    truth = [e["id"] for e in tokens(collect(plain, request()))]
    asyncio.run(plain.close())

    class Drafted(Drafting):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.lookup = Oracle(rendered.ids, truth, {0: 2, 1: None})

    monkeypatch.setattr(local_module, "Drafting", Drafted)
    spec = LocalBackend(model, Vocabulary(tokenizer), speculative=NGRAM)
    events = collect(spec, request())
    asyncio.run(spec.close())
    assert [e["id"] for e in tokens(events)] == truth and events[-1]["accepted"] > 10
