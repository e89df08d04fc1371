"""How many drafts a verification pass should carry, where a pass costs more the more rows it has.

On transformers a pass of 2–3 tokens costs as much as one of 8 on these CPUs, so drafting long is
free. llama.cpp's CPU kernels are the opposite for a small model: a batch's rows cost nearly what
steps would (SmolLM2 at a 1,000-token context, one thread: each row past the first adds 0.7–0.9 of
a step in Q4_1, 0.5–0.9 in Q4_0 and Q8_0; `python bench/speculative.py passes`), so a draft the
model rejects costs nearly a step, and drafting only pays when long drafts are nearly certain. PassCost measures a step and each extra row as the backend
runs (moving averages: the machine's load changes), and picks the draft length whose expected
tokens per unit of time are highest, given the chance that each draft stands; none when plain
decoding is expected to be faster. An estimate is only corrected by passes, so one that says "do
not draft" would never be tested again: after IDLE steps without a pass it drifts back toward its
prior, and a pass is tried again (one wasted pass every hundred steps or so while drafts keep failing).
"""

from __future__ import annotations

SMOOTHING = 0.15  # weight of the newest measurement in the moving averages
MARGIN = 1.25  # a pass must promise this many times plain decoding's rate: the estimates are noisy, a loss dear
PRIOR_EXTRA = 0.8  # an extra row's cost in steps before any pass is measured (SmolLM2 Q4_1, one thread)
IDLE = 32  # steps without a pass after which the estimates drift back toward their priors
RELAX = 0.02  # how far each such step moves them


class PassCost:
    """A step's time and an extra row's share of it, measured; one per backend (decode thread only).
    `extra`: the backend's own measurement at load, when it made one (the prior, drifted back to)."""

    def __init__(self, extra: float = PRIOR_EXTRA, fixed: bool = False) -> None:
        self.fixed = fixed  # every draft offered is verified, whatever it costs (draft_length "fixed")
        self.step: float | None = None  # seconds for one token, with the choice of the next
        self.prior = self.extra = extra  # each row past the first, in steps
        self._idle = 0  # steps since the last pass

    def stepped(self, seconds: float) -> None:
        self.step = seconds if self.step is None else self.step + SMOOTHING * (seconds - self.step)
        self._idle += 1
        if self._idle > IDLE and self.extra > self.prior:  # measured dear a while ago: try again
            self.extra += RELAX * (self.prior - self.extra)

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
        if self.fixed:
            return len(chances)
        best, rate, expected = 0, MARGIN, 1.0
        for k, chance in enumerate(chances, 1):
            expected += chance
            candidate = expected / (1.0 + self.extra * k)
            if candidate > rate:
                best, rate = k, candidate
        return best

    def described(self) -> dict:
        return {"step_ms": round(self.step * 1000, 2) if self.step else None, "extra_row": round(self.extra, 3),
                "extra_row_at_load": round(self.prior, 3), "draft_length": "fixed" if self.fixed else "measured"}


def chances_of(drafter, record: Acceptance, count: int) -> list[float]:
    """Each draft's chance of standing with every one before it: prompt lookup's record in this
    request; suffix decoding's frequencies along the path, discounted by how few occurrences they were
    counted over (the rule of succession: seen n times out of n, (n + 1) / (n + 2)), and no surer
    than its record in this request."""
    likely = getattr(drafter, "likelihood", None)
    recorded = record.chances(count)
    if not likely:
        return recorded
    support = getattr(drafter, "support", 0)
    discount = (support + 1) / (support + 2)
    return [min(chance * discount, cap) for chance, cap in zip(likely, recorded)]


class Acceptance:
    """How often the i-th draft of a pass (and every one before it) stood, per position, as a moving
    average from an optimistic prior (a drafter that is never tried is never learned about): the
    chances PassCost weighs for prompt lookup, and the most it trusts suffix decoding's own estimates.
    `decay`: the prior of the i-th is prior ** (i + 1), each draft as likely as the one before it
    (prompt lookup's: nothing says a copied run goes on); else the same for all (suffix decoding's
    cap: its own estimates already fall along the path)."""

    def __init__(self, most: int, prior: float = 0.95, decay: bool = False) -> None:
        self.priors = [prior ** (i + 1) if decay else prior for i in range(most)]
        self.stood = list(self.priors)
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
            for i, (chance, prior) in enumerate(zip(stood, self.priors)):
                if chance < prior:
                    stood[i] += RELAX * (prior - chance)
