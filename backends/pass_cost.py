"""How many drafts a verification pass should carry, where a pass costs more the more rows it has.

On transformers a pass of 2–3 tokens costs as much as one of 8 on these CPUs, so drafting long is
free. llama.cpp's quantized CPU kernels are the opposite: a batch's rows are computed one after
another (SmolLM2's Q4_1 here: each row past the first adds half a one-token step or more, and more
when another process holds a core), so a draft the model rejects costs nearly a step, and drafting
only pays when the drafts are likely. PassCost measures a step and each extra row as the backend
runs (moving averages: the machine's load changes), and picks the draft length whose expected
tokens per unit of time are highest, given the chance that each draft stands; none when plain
decoding is expected to be faster. An estimate is only corrected by passes, so one that says "do
not draft" would never be tested again: after IDLE steps without a pass it drifts back toward its
prior, and a pass is tried again (at most one wasted pass a few dozen steps when drafts keep failing).
"""

from __future__ import annotations

SMOOTHING = 0.15  # weight of the newest measurement in the moving averages
MARGIN = 1.05  # a pass must promise this many times plain decoding's rate to be worth the risk
PRIOR_EXTRA = 0.6  # an extra row's cost in steps before any pass is measured (SmolLM2 Q4_1, 1–2 threads)
IDLE = 16  # steps without a pass after which the estimates drift back toward their priors
RELAX = 0.05  # how far each such step moves them


class PassCost:
    """A step's time and an extra row's share of it, measured; one per backend (decode thread only)."""

    def __init__(self) -> None:
        self.step: float | None = None  # seconds for one token, with the choice of the next
        self.extra = PRIOR_EXTRA  # each row past the first, in steps
        self._idle = 0  # steps since the last pass

    def stepped(self, seconds: float) -> None:
        self.step = seconds if self.step is None else self.step + SMOOTHING * (seconds - self.step)
        self._idle += 1
        if self._idle > IDLE and self.extra > PRIOR_EXTRA:  # measured dear a while ago: try again
            self.extra += RELAX * (PRIOR_EXTRA - self.extra)

    def passed(self, rows: int, seconds: float) -> None:
        self._idle = 0
        if self.step is None or rows < 2:
            return
        extra = min(max((seconds / self.step - 1.0) / (rows - 1), 0.0), 4.0)
        self.extra += SMOOTHING * (extra - self.extra)

    def length(self, chances: list[float]) -> int:
        """How many of the drafts to verify: `chances[i]` is the chance that drafts 0..i all stand.
        Expected tokens per step-equivalent for k drafts: (1 + sum of the first k chances) / (1 +
        extra × k); 0 unless the best k beats plain decoding (1 per step) by MARGIN."""
        best, rate, expected = 0, MARGIN, 1.0
        for k, chance in enumerate(chances, 1):
            expected += chance
            candidate = expected / (1.0 + self.extra * k)
            if candidate > rate:
                best, rate = k, candidate
        return best

    def described(self) -> dict:
        return {"step_ms": round(self.step * 1000, 2) if self.step else None, "extra_row": round(self.extra, 3)}


class Acceptance:
    """How often the i-th draft of a pass (and every one before it) stood, per position, as a moving
    average from an optimistic prior (a drafter that is never tried is never learned about): the
    chances PassCost weighs for a drafter that gives none of its own (prompt lookup)."""

    PRIOR = 0.8

    def __init__(self, most: int) -> None:
        self.stood = [self.PRIOR] * most
        self._idle = 0  # proposals not verified since the last pass

    def chances(self, count: int) -> list[float]:
        return self.stood[:count]

    def record(self, drafted: int, accepted: int) -> None:
        self._idle = 0
        stood = self.stood
        for i in range(min(drafted, len(stood))):
            stood[i] += SMOOTHING * ((1.0 if i < accepted else 0.0) - stood[i])

    def unverified(self) -> None:
        """Drafts were proposed and not worth a pass: past IDLE of those, the record drifts back."""
        self._idle += 1
        if self._idle > IDLE:
            stood = self.stood
            for i, chance in enumerate(stood):
                if chance < self.PRIOR:
                    stood[i] += RELAX * (self.PRIOR - chance)
