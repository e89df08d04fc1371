"""How many drafts a llama.cpp verification pass carries (backends/speculative/pass_cost.py): as many as their
chances of standing pay for, by what a step and each extra row are measured to cost; none when plain
decoding is expected to be faster; and an estimate that stopped drafting is tried again later."""

from __future__ import annotations

import pytest

from looptrace.backends.speculative.pass_cost import IDLE, MARGIN, PRIOR_EXTRA, Acceptance, PassCost


def measured(extra: float, step: float = 0.01, at_load: float = PRIOR_EXTRA) -> PassCost:
    """A PassCost that has seen passes whose every row past the first cost `extra` steps."""
    cost = PassCost(at_load)
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


def test_a_fixed_draft_length_verifies_every_draft_whatever_it_costs():
    dear = measured(1.0)
    dear.fixed = True
    assert dear.length([0.05] * 6) == 6 and dear.length([]) == 0
    assert dear.described()["draft_length"] == "fixed"


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
    cost = measured(2.0, at_load=0.4)  # cheap rows at load, dear since
    assert cost.length([1.0] * 8) == 0
    for _ in range(IDLE):
        cost.stepped(0.01)
    assert cost.length([1.0] * 8) == 0  # not at once
    steps = next(n for n in range(1, 400) if cost.stepped(0.01) or cost.length([1.0] * 8))
    assert steps < 150 and cost.extra > 0.4
    cost.passed(9, 0.01 * 17)  # measured dear again: back off again
    assert cost.length([1.0] * 8) == 0


def test_prompt_lookups_record_of_what_stood_drifts_back_when_unused():
    record = Acceptance(4)
    for _ in range(40):
        record.record(4, 0)  # every draft rejected
    assert max(record.chances(4)) < 0.01
    for _ in range(IDLE + 60):
        record.unverified()
    assert min(record.chances(4)) > 0.5
    record.record(4, 2)
    assert record.chances(4)[:2] > record.chances(4)[2:]


def test_suffix_decodings_frequencies_count_for_less_when_seen_few_times():
    from looptrace.backends.speculative.pass_cost import chances_of

    class Seen:
        likelihood = [1.0, 1.0, 0.5]
        support = 1  # one earlier occurrence: "certain" to the frequency, 2/3 by the rule of succession

    record = Acceptance(3, 0.95)
    assert chances_of(Seen, record, 3) == pytest.approx([2 / 3, 2 / 3, 1 / 3])
    Seen.support = 38
    assert chances_of(Seen, record, 3) == pytest.approx([0.95, 0.95, 0.5 * 39 / 40])  # capped by its record
    assert chances_of(object(), Acceptance(3, 0.8, decay=True), 3) == pytest.approx([0.8, 0.64, 0.512])  # its record
