"""Stop strings: cut the output where one appears, even when it arrives split across tokens."""

from __future__ import annotations


class StopStrings:
    """Holds back just enough text to see a stop string that has only partly arrived."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self._hold = max((len(s) for s in self.stops), default=1) - 1
        # Every proper start of a stop string, so a partly arrived one is one set lookup per length.
        self._starts = frozenset(s[:k] for s in self.stops for k in range(1, len(s)))
        self._pending = ""
        self.hit = False
        self.matched: str | None = None  # the stop string that matched (Anthropic's answer names it)

    def feed(self, text: str) -> str:
        """The text that is safe to pass on; sets `hit` when a stop string matched."""
        buffer = self._pending + text
        found = [(i, s) for s in self.stops if (i := buffer.find(s)) >= 0]
        if found:
            cut, self.matched = min(found, key=lambda hit: hit[0])
            self.hit = True
            self._pending = ""
            return buffer[:cut]
        keep = self._partial_suffix(buffer)
        self._pending = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep]

    def flush(self) -> str:
        text, self._pending = self._pending, ""
        return text

    def _partial_suffix(self, buffer: str) -> int:
        # The longest end of the buffer that is the start of some stop string.
        for size in range(min(self._hold, len(buffer)), 0, -1):
            if buffer[-size:] in self._starts:
                return size
        return 0
