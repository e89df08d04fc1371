"""Values kept by key, the least recently used out past a bound on their sizes: the caches a long
session's turn reads so that it costs what it adds (kept renderings, message digests, history units).
Thread-safe; sizes are as the caller counts them (about bytes)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, Hashable, TypeVar

V = TypeVar("V")


class ByteBounded(Generic[V]):
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._kept: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> V | None:
        with self._lock:
            found = self._kept.get(key)
            if found is None:
                return None
            self._kept.move_to_end(key)
            return found[0]

    def put(self, key: Hashable, value: V, size: int) -> None:
        """`value` kept under `key` (what was there dropped); one larger than the bound alone is not kept."""
        with self._lock:
            old = self._kept.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            if size > self.max_bytes:
                return
            self._kept[key] = (value, size)
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, (_, gone) = self._kept.popitem(last=False)
                self._bytes -= gone

    def __getitem__(self, key: Hashable) -> V:
        return self._kept[key][0]  # for a test's look, not counted as a use

    def __len__(self) -> int:
        return len(self._kept)

    @property
    def bytes(self) -> int:
        return self._bytes
