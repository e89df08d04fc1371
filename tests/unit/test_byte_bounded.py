"""The caches a long session's turn reads (kept renderings, message digests, history units) stay
within their bytes, drop the least recently used first, and never keep what alone passes the bound."""

from __future__ import annotations

from looptrace.common.byte_bounded import ByteBounded


def test_the_least_recently_used_goes_first_and_the_bound_holds():
    kept: ByteBounded[str] = ByteBounded(100)
    kept.put("a", "A", 40)
    kept.put("b", "B", 40)
    assert kept.get("a") == "A"  # a used: b is now the oldest
    kept.put("c", "C", 40)
    assert kept.get("b") is None and kept.get("a") == "A" and kept.get("c") == "C"
    assert kept.bytes == 80 and len(kept) == 2


def test_a_value_past_the_bound_is_not_kept_and_drops_the_one_it_replaces():
    kept: ByteBounded[str] = ByteBounded(100)
    kept.put("a", "A", 10)
    kept.put("a", "A2", 101)
    assert kept.get("a") is None and kept.bytes == 0


def test_putting_a_key_again_counts_its_size_once():
    kept: ByteBounded[str] = ByteBounded(100)
    kept.put("a", "A", 30)
    kept.put("a", "A2", 50)
    assert kept["a"] == "A2" and kept.bytes == 50 and len(kept) == 1
