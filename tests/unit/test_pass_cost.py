"""How many drafts a llama.cpp verification pass carries (backends/pass_cost.py): as many as their
chances of standing pay for, by what a step and each extra row are measured to cost; none when plain
decoding is expected to be faster; and an estimate that stopped drafting is tried again later."""

from __future__ import annotations

import pytest

from looptrace.backends.pass_cost import IDLE, MARGIN, PRIOR_EXTRA, Acceptance, PassCost


def measured(extra: float, step: float = 0.01) -> PassCost:
    """A PassCost that has seen passes whose every row past the first cost `extra` steps."""
    cost = PassCost()
    cost.stepped(step)
    for _ in range(60):
        cost.passed(5, step * (1 + 4 * extra))
    assert cost.extra == pytest.approx(extra, abs=1e-3)
    return cost


def test_likely_drafts_go_in_whole_and_unlikely_ones_not_at_all():
    cheap = measured(0.1)
    assert cheap.length([1.0] * 8) == 8
    assert cheap.length([0.9, 0.6, 0.3, 0.05]) == 3  # the fourth costs more than its 5 % returns
    assert cheap.length([0.05, 0.01]) == 0  # plain decoding is faster
    dear = measured(1.0)  # a row costs a whole step: no draft can pay
    assert dear.length([1.0] * 8) == 0


def test_a_pass_must_beat_plain_decoding_by_the_margin():
    cost = measured(0.5)
    # One draft standing with chance c gives (1 + c) / 1.5 tokens per step: worth it above c = 0.575.
    threshold = MARGIN * 1.5 - 1
    assert cost.length([threshold - 0.01]) == 0 and cost.length([threshold + 0.01]) == 1


def test_a_step_measured_slow_is_what_passes_are_weighed_against():
    cost = PassCost()
    cost.stepped(0.02)
    cost.passed(3, 0.03)  # 1.5 steps for 3 rows: 0.25 a row past the first, moving the prior a little
    assert PRIOR_EXTRA > cost.extra > 0.25


def test_an_estimate_that_stopped_drafting_drifts_back_and_drafting_is_tried_again():
    cost = measured(2.0)
    assert cost.length([1.0] * 8) == 0
    for _ in range(IDLE):
        cost.stepped(0.01)
    assert cost.length([1.0] * 8) == 0  # not at once
    steps = 0
    while not cost.length([1.0] * 8):
        cost.stepped(0.01)
        steps += 1
    assert steps < 60 and cost.extra > PRIOR_EXTRA
    cost.passed(9, 0.01 * 17)  # measured dear again: back off again
    assert cost.length([1.0] * 8) == 0


def test_prompt_lookups_record_of_what_stood_drifts_back_when_unused():
    record = Acceptance(4)
    for _ in range(40):
        record.record(4, 0)  # every draft rejected
    assert max(record.chances(4)) < 0.01
    for _ in range(IDLE + 40):
        record.unverified()
    assert min(record.chances(4)) > 0.5
    record.record(4, 2)
    assert record.chances(4)[:2] > record.chances(4)[2:]
