"""A prompt's blocks as keys: each block of `block_size` tokens keyed by a hash of the key before it and its own
tokens, as vLLM chains its block hashes, so that a prompt is looked up by its tokens alone (kv_index.py, kv_groups.py)
without vLLM's hash function or seed."""

from __future__ import annotations

from collections.abc import Iterator

ROOT = 0  # the chain's key before a prompt's first block


def salted_root(salt: str) -> int:
    """The chain's key before the first block of a prompt sent with a cache salt (kv_groups.py reads it from
    vLLM's events): no other salt's chain, nor an unsalted one, meets it."""
    return hash((ROOT, "salt", salt))


class PromptBlocks:
    """A prompt's block keys, computed once per block size and only as far as a lookup walks."""

    __slots__ = ("ids", "_keys", "_root")

    def __init__(self, ids: list[int], salt: str | None = None) -> None:
        self.ids = ids
        self._keys: dict[int, list[int]] = {}
        # A salted prompt's blocks are other blocks (vLLM hashes its cache_salt into the first).
        self._root = ROOT if salt is None else salted_root(salt)

    def keys(self, block_size: int, limit: int) -> Iterator[int]:
        """The keys of the first `limit` whole blocks, in order."""
        keys = self._keys.setdefault(block_size, [])
        yield from keys[:limit]
        ids, n = self.ids, len(keys)
        key = keys[-1] if keys else self._root
        while n < limit:
            key = hash((key, *ids[n * block_size:(n + 1) * block_size]))
            keys.append(key)
            n += 1
            yield key

    def key(self, block_size: int, n: int) -> int:
        """The key of block `n` (from 0): computed as far as it, where not yet."""
        keys = self._keys.get(block_size)
        if keys is None or len(keys) <= n:
            for _ in self.keys(block_size, n + 1):
                pass
            keys = self._keys[block_size]
        return keys[n]

    def usable_blocks(self, block_size: int) -> int:
        """Whole blocks vLLM may find cached: it computes at least the prompt's last token again."""
        return max(0, len(self.ids) - 1) // block_size


def walk(prompt: PromptBlocks, size: int, held, coming: dict | None = None) -> int:
    """How many of the prompt's leading blocks are held (or `coming`: being computed), stopping at the first that is
    not."""
    n = 0
    for key in prompt.keys(size, prompt.usable_blocks(size)):
        if key not in held and (not coming or key not in coming):
            break
        n += 1
    return n
