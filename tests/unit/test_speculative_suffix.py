"""Suffix decoding (issue 29): what backends/speculative/suffix.py proposes and what it keeps.

The drafts are the continuation most occurrences of the longest matching suffix took, as long as
its frequency stays at min_prob or above and no longer than factor × the match; a conversation's
next turn extends its sequence instead of indexing it again; other conversations' sequences stay
within the bounds, the least recently used dropped first. Its use by the backends (greedy output
unchanged) is in test_speculative.py and tests/integration/test_speculative_session.py.
"""

from __future__ import annotations

import pytest

from looptrace.backends.speculative.suffix import ANCHORS, SuffixCache


def cache(**kwargs) -> SuffixCache:
    settings = {"max_requests": 100, "max_tokens": 1 << 20, "depth": 24, "factor": 1.0, "min_prob": 0.1, **kwargs}
    return SuffixCache(settings["max_requests"], settings["max_tokens"], settings["depth"], settings["factor"],
                       settings["min_prob"])


def test_the_most_frequent_continuation_is_proposed_with_its_frequency():
    # [1 2 3] was followed by 4 5 twice and by 9 once; the newest occurrence is followed by 9.
    prompt = [1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 9, 0, 7, 1, 2, 3]
    drafter = cache().begin(prompt)
    assert drafter.propose(8) == [4, 5, 0]  # as long as the match (3): factor 1.0
    assert drafter.likelihood == pytest.approx([2 / 3, 2 / 3, 2 / 3])


def test_a_tie_goes_to_the_most_recent_continuation():
    drafter = cache().begin([5, 6, 1, 2, 5, 6, 3, 4, 8, 5, 6])
    assert drafter.propose(2) == [3, 4]


def test_the_draft_stops_where_the_path_becomes_unlikely():
    # The longest match, [0 7 8], occurred three times: each went on with 1, then they part ways (11,
    # 12, 13): a third of the path, below 0.34; at 0.3 the newest way (13) is followed to its end.
    prompt = [7, 8, 1, 10, 0, 7, 8, 1, 11, 0, 7, 8, 1, 12, 0, 7, 8, 1, 13, 0, 7, 8]
    drafter = cache(min_prob=0.34, factor=4.0).begin(prompt)
    assert drafter.propose(8) == [1] and drafter.likelihood == [1.0]
    drafter = cache(min_prob=0.3, factor=4.0).begin(prompt)
    assert drafter.propose(8) == [1, 13, 0, 7, 8] and drafter.likelihood[1:] == pytest.approx([1 / 3] * 4)


def test_the_draft_is_no_longer_than_factor_times_the_match():
    text = list(range(100, 140))
    prompt = text + [1] + text[:6]  # the last 6 tokens match the start of the text
    assert len(cache(factor=1.0).begin(prompt).propose(32)) == 6
    assert len(cache(factor=2.0).begin(prompt).propose(32)) == 12
    assert len(cache(factor=2.0).begin(prompt).propose(5)) == 5  # and never more than asked
    assert cache(depth=4, factor=1.0).begin(prompt).propose(32) == text[6:10]  # the match counts up to the depth


def test_nothing_is_proposed_without_an_earlier_occurrence_nor_from_the_suffix_itself():
    drafter = cache().begin([1, 2, 3, 4, 5, 6])
    assert drafter.propose(4) == []
    drafter.append(1)
    assert drafter.propose(4) == []  # one token: below the shortest anchor
    drafter.append(2)
    assert drafter.propose(4) == [3, 4]


def test_output_tokens_join_the_context_as_they_come():
    drafter = cache().begin([40, 41, 42, 43, 44])
    for token in (50, 51, 52, 40, 41):
        drafter.append(token)
    assert drafter.propose(3) == [42, 43]  # match of 2: two drafts
    drafter.append(42)
    assert drafter.propose(3) == [43, 44, 50]


def test_a_conversations_next_turn_extends_its_sequence():
    kept = cache()
    first = [1, 2, 3, 4, 5, 6, 7, 8]
    drafter = kept.begin(first, "c")
    for token in (20, 21, 22):
        drafter.append(token)
    drafter.finish()
    assert kept.tokens == 11 and len(kept.sequences) == 1
    second = [*first, 20, 21, 22, 30, 31, 32]
    again = kept.begin(second, "c")
    assert again.sid == drafter.sid and again.unindexed == [30, 31, 32]  # only what is new gets indexed
    again.append(1)
    again.append(2)
    assert again.propose(4) == [3, 4]
    again.finish()
    assert kept.tokens == 16 and len(kept.sequences) == 1


def test_a_rewritten_history_starts_a_new_sequence_and_the_old_is_drafted_from():
    kept = cache(max_requests=2)
    kept.begin([1, 2, 3, 4, 5], "c").finish()
    drafter = kept.begin([7, 1, 2], "c")  # compacted: the conversation's sequence is not continued
    assert drafter.unindexed == [7, 1, 2] and len(kept.sequences) == 2
    assert drafter.propose(4) == [3, 4]  # but what it held is still drafted from
    drafter.finish()
    again = kept.begin([7, 1, 2, 8], "c")
    assert again.sid == drafter.sid  # the new one is the conversation's now
    again.finish()
    kept.begin([50, 51], "d").finish()
    assert kept.tokens == 2 + 4 and len(kept.sequences) == 2  # the old one went first, in its place


def test_without_a_conversation_id_a_prompt_continues_the_sequence_it_starts_with():
    kept = cache()
    start = list(range(1, 41))  # found by its first tokens (suffix.PREFIX)
    kept.begin(start, None).finish()
    kept.begin([7, 7, 7], None).finish()
    drafter = kept.begin([*start, 41, 42], None)
    assert drafter.unindexed == [41, 42]
    drafter.finish()
    assert len(kept.sequences) == 2


def test_other_conversations_answers_are_drafted_from():
    kept = cache()
    answer = [70, 71, 72, 73, 74, 75, 76, 77]
    first = kept.begin([1, 2, 3], "a")
    for token in answer:
        first.append(token)
    first.finish()
    other = kept.begin([9, 9, 70, 71, 72], "b")
    assert other.propose(8) == [73, 74, 75]


def test_the_bounds_drop_the_least_recently_used():
    kept = cache(max_requests=2)
    for name, start in (("a", 100), ("b", 200), ("c", 300)):
        kept.begin(list(range(start, start + 10)), name).finish()
    assert len(kept.sequences) == 2 and kept.tokens == 20
    assert kept.begin([1, 2, 100, 101], "d").propose(4) == []  # a's is gone
    kept = cache(max_tokens=25)
    for name, start in (("a", 100), ("b", 200), ("c", 300)):
        kept.begin(list(range(start, start + 10)), name).finish()
    assert kept.tokens == 20 and kept.begin([9, 200, 201], "d").propose(2) == [202, 203]
    assert cache(max_requests=0).begin([1, 2, 3], "a").propose(1) == []


def test_the_index_is_rebuilt_once_dropped_entries_outnumber_the_live_and_proposes_the_same():
    kept = cache(max_requests=1)
    for start in range(0, 5000, 500):
        drafter = kept.begin(list(range(start, start + 500)) + [1, 2, 3, 4], f"c{start}")
        drafter.finish()
    assert kept.tokens == 504
    entries = sum(1 if isinstance(v, int) else len(v) for v in kept.index.values())
    assert entries <= 2 * len(ANCHORS) * max(kept.tokens, 1024)  # rebuilt, not grown with every drop
    drafter = kept.begin([4800, 4801, 4802], "x")
    assert drafter.propose(2) == [4803, 4804]


def test_n_grams_of_the_same_hash_are_told_apart(monkeypatch):
    # The index is keyed by hash: with every n-gram colliding, the drafts are still the right ones.
    from looptrace.backends.speculative import suffix

    monkeypatch.setattr(suffix, "hash", lambda ngram: 7, raising=False)
    prompt = [1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 9, 0, 7, 1, 2, 3]
    drafter = cache().begin(prompt)
    assert drafter.propose(8) == [4, 5, 0] and drafter.likelihood == pytest.approx([2 / 3] * 3)
    assert cache().begin([5, 6, 1, 2, 5, 6, 3, 4, 8, 5, 6]).propose(2) == [3, 4]
    assert cache().begin([1, 2, 3, 4, 5, 6]).propose(4) == []


def test_a_running_request_drafts_on_across_a_rebuild():
    # Other requests' ends drop sequences and rebuild the index while this one runs: its drafter still
    # holds the sequence the cache extends.
    kept = cache(max_requests=1)
    running = kept.begin([1, 2, 3, 4, 5, 6, 7, 8], "running")
    assert running.propose(2) == []
    added = 0
    for start in range(1000, 9000, 500):
        kept.begin(list(range(start, start + 500)), f"c{start}").finish()
        added += 500 * len(ANCHORS)
    assert kept._entries < added  # rebuilt on the way
    assert kept.sequences[running.sid] is running.seq
    running.append(1)
    running.append(2)
    assert running.propose(2) == [3, 4]
