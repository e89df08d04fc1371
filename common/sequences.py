"""Comparing token sequences."""

from __future__ import annotations

from collections.abc import Sequence


def common_prefix(a: Sequence, b: Sequence) -> int:
    """How many leading items two sequences share: what of a prompt a cache already holds, where two
    renderings of it part, or which messages of a conversation are new."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
