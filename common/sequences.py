"""Comparing token sequences."""

from __future__ import annotations

from collections.abc import Sequence

BLOCK = 4096  # items compared at once: slices compare in C, a few hundred times faster than a loop


def common_prefix(a: Sequence, b: Sequence) -> int:
    """How many leading items two sequences share: what of a prompt a cache already holds, where two
    renderings of it part, or which messages of a conversation are new. Lists, arrays and strings are
    compared a block at a time (a long agent conversation's prompt is 100 K tokens and more)."""
    n = min(len(a), len(b))
    mixed = type(a) is not type(b)  # a list and an array (or tuple) compare unequal as they are
    start = 0
    while start < n:
        end = min(start + BLOCK, n)
        x, y = a[start:end], b[start:end]
        if x != y if not mixed else list(x) != list(y):
            break
        start = end
    else:
        return n
    for i in range(start, min(start + BLOCK, n)):
        if a[i] != b[i]:
            return i
    return min(start + BLOCK, n)
