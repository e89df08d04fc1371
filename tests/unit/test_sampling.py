"""The sampling steps, in the promised order, and the per-token report."""

import math

import pytest
import torch

from looptrace.backends.base import SamplingParams
from looptrace.backends.sampling import Penalties, choose, generator_for, next_token


def draws(logits, params, n=4000, seed=0):
    generator = torch.Generator().manual_seed(seed)
    counts = torch.zeros(logits.numel())
    for _ in range(n):
        counts[choose(logits, params, generator)] += 1
    return counts / n


def test_greedy_takes_the_lowest_id_among_equal_maxima():
    logits = torch.tensor([0.0, 3.0, 1.0, 3.0, 3.0])
    assert choose(logits, SamplingParams(temperature=0), None).item() == 1


def test_top_k_one_is_greedy_at_any_temperature():
    logits = torch.tensor([0.1, 0.2, 2.0, 0.3])
    params = SamplingParams(temperature=1.5, top_k=1)
    assert set(draws(logits, params, n=200).nonzero().flatten().tolist()) == {2}


def test_top_p_keeps_tokens_until_the_mass_is_reached_then_renormalises():
    probs = torch.tensor([0.5, 0.3, 0.2])
    freq = draws(probs.log(), SamplingParams(temperature=1.0, top_p=0.7))
    # 0.5 < 0.7 so the second token stays; 0.8 >= 0.7 so the third goes.
    assert freq[2] == 0
    assert freq[0] == pytest.approx(0.5 / 0.8, abs=0.03)


def test_top_p_keeps_at_least_one_token():
    probs = torch.tensor([0.6, 0.4])
    assert draws(probs.log(), SamplingParams(temperature=1.0, top_p=0.01), n=300)[0] == 1.0


def test_temperature_divides_before_top_k_and_softmax():
    logits = torch.tensor([2.0, 1.0, 0.0, -5.0])
    freq = draws(logits, SamplingParams(temperature=2.0, top_k=3), n=6000)
    expected = torch.softmax(torch.tensor([1.0, 0.5, 0.0]), dim=-1)
    assert freq[3] == 0
    assert torch.allclose(freq[:3], expected, atol=0.03)


def test_a_seed_reproduces_the_draws():
    logits = torch.randn(1000, generator=torch.Generator().manual_seed(1))
    params = SamplingParams(temperature=1.0, seed=1234)
    first = [choose(logits, params, g).item() for g in [generator_for(params, torch.device("cpu"))] for _ in range(20)]
    second = [choose(logits, params, g).item() for g in [generator_for(params, torch.device("cpu"))] for _ in range(20)]
    assert first == second and len(set(first)) > 1


def test_the_report_gives_the_models_own_logprob_rank_and_top_five():
    logits = torch.tensor([1.0, 4.0, 2.0, 3.0, 0.5, 2.5, -1.0])
    logprobs = torch.log_softmax(logits, dim=-1)
    generator = torch.Generator().manual_seed(0)
    # top_k=6 and a seed that draws id 2 here: a sampled token below the top, so its rank is > 1.
    choice = next(c for c in (next_token(logits, SamplingParams(temperature=5.0), generator) for _ in range(200))
                  if c.token_id == 2)
    assert choice.logprob == pytest.approx(logprobs[2].item())
    assert choice.rank == 4  # 4.0, 3.0 and 2.5 are more likely
    assert choice.top_ids == [1, 3, 5, 2, 0]
    assert choice.top_logprobs == pytest.approx(logprobs[[1, 3, 5, 2, 0]].tolist())
    assert math.exp(choice.logprob) == pytest.approx(torch.softmax(logits, -1)[2].item())


def test_greedy_reports_the_top_token_with_rank_one():
    logits = torch.tensor([1.0, 4.0, 2.0, 3.0, 0.5, 2.5, -1.0])
    choice = next_token(logits, SamplingParams(temperature=0), None)
    assert (choice.token_id, choice.logprob, choice.rank) == (1, pytest.approx(torch.log_softmax(logits, -1)[1].item()), 1)


@pytest.mark.parametrize("tied", [[3, 7], [2, 5, 9], [1, 2, 3, 4, 5, 6, 8]])
def test_greedy_ties_go_to_the_lowest_id_even_past_the_top_five(tied):
    logits = torch.zeros(12)
    logits[tied] = 2.0
    assert next_token(logits, SamplingParams(temperature=0), None).token_id == min(tied) == logits.argmax().item()


def test_penalties_follow_openais_formula_over_the_generated_tokens():
    logits = torch.zeros(6)
    penalties = Penalties(SamplingParams(presence_penalty=0.5, frequency_penalty=0.25), logits)
    for token in (2, 2, 2, 4):
        penalties.add(token)
    # presence once per token that appeared, frequency once per appearance
    assert penalties.offsets.tolist() == [0.0, 0.0, 0.5 + 3 * 0.25, 0.0, 0.5 + 0.25, 0.0]


def test_penalties_change_the_choice_but_not_the_report():
    logits = torch.tensor([1.0, 4.0, 2.0, 3.0, 0.5, 2.5, -1.0])
    penalties = Penalties(SamplingParams(temperature=0, presence_penalty=2.0), logits)
    penalties.add(1)
    choice = next_token(logits, SamplingParams(temperature=0, presence_penalty=2.0), None, penalties)
    # 4.0 - 2 = 2.0 falls below 3.0: greedy now takes id 3, reported under the model's own distribution.
    logprobs = torch.log_softmax(logits, -1)
    assert choice.token_id == 3 and choice.rank == 2
    assert choice.logprob == pytest.approx(logprobs[3].item())
    assert choice.top_ids == [1, 3, 5, 2, 0]


def test_a_negative_penalty_favours_what_was_said():
    logits = torch.tensor([2.0, 1.5, 1.0])
    params = SamplingParams(temperature=0, frequency_penalty=-1.5)
    penalties = Penalties(params, logits)
    penalties.add(2)
    assert next_token(logits, params, None, penalties).token_id == 2


@pytest.mark.parametrize("case", ["spread", "peaked", "tied", "tied past five", "few finite", "flat"])
def test_greedy_choice_in_numpy_reports_what_next_token_reports(case):
    """The llama.cpp backend's greedy path (numpy) against next_token's (torch), on a real vocabulary's size."""
    from looptrace.backends.sampling import greedy_choice

    generator = torch.Generator().manual_seed(7)
    logits = torch.randn(49152, generator=generator) * 3
    if case == "peaked":
        logits[123] = 40.0
    elif case == "tied":
        logits[[9000, 5, 700]] = 20.0
    elif case == "tied past five":
        logits[[3, 11, 17, 29, 31, 37, 41]] = 20.0
    elif case == "few finite":
        logits[:] = float("-inf")
        logits[[2, 8, 40]] = torch.tensor([1.0, 3.0, 2.0])
    elif case == "flat":
        logits[:] = 0.5
    ours = greedy_choice(logits.numpy())
    theirs = next_token(logits, SamplingParams(temperature=0), None)
    assert (ours.token_id, ours.rank) == (theirs.token_id, theirs.rank)
    if case in ("spread", "peaked"):  # elsewhere equal logits fill the five, in whatever order topk likes
        assert ours.top_ids == theirs.top_ids
    assert {logits[i].item() for i in ours.top_ids} == {logits[i].item() for i in theirs.top_ids}
    assert ours.top_logprobs == pytest.approx(theirs.top_logprobs, abs=1e-5)
