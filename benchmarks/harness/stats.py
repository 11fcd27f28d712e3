"""The one statistics module of every benchmark and study: mean ± SE, the 2-SE rule and its words, medians of
per-seed ratios, time to a target. Pure arithmetic (no I/O), so tests check it against hand computations.

Rules, stated once:
- SE of a mean = sample std / sqrt(n); none from one value.
- SE of a difference of two cells = sqrt(se_a² + se_b²) (separate runs, not paired draws); of a paired
  difference = the SE of the per-seed differences.
- A gap is *separated* when |gap| >= SEPARATED_AT_SE standard errors of it; only then is one side called
  "ahead"/"behind" (or the caller's words). Below that it is "not separated" (or "level"), whatever the sign of
  the means: a higher mean alone is never "ahead".
- A speed-up over seeds is the MEDIAN OF THE PER-SEED RATIOS (baseline time / candidate time, seed by seed),
  never a ratio of two medians.
- A curve is [(seconds, accuracy), ...] in time order; time to a target is the first point at or above it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

SEPARATED_AT_SE = 2.0
EPS = 1e-9  # accuracies are multiples of 1/tasks; a point equal to the target up to rounding reaches it

Curve = Sequence[tuple[float, float]]


@dataclass(frozen=True)
class MeanSE:
    """Mean of n values and its standard error (None from fewer than two values)."""

    mean: float | None
    se: float | None
    n: int
    std: float | None = None

    def text(self, signed: bool = False) -> str:
        """'0.63 ± 0.02', '+0.03 ± 0.02', 'missing'."""
        if self.mean is None:
            return "missing"
        head = f"{self.mean:+.2f}" if signed else f"{self.mean:.2f}"
        return head + (f" ± {self.se:.2f}" if self.se is not None else "")

    def row(self) -> dict:
        """{n, mean, std, se}: a cell of a results file."""
        return {"n": self.n, "mean": self.mean, "std": self.std, "se": self.se}


def pm(mean: float | None, se: float | None, signed: bool = False) -> str:
    """'0.63 ± 0.02' ('+0.03 ± 0.02' signed; no '±' without an SE; 'missing' without a mean)."""
    return MeanSE(mean, se, 0).text(signed)


def mean_se(values: Iterable[float]) -> MeanSE:
    xs = list(values)
    n = len(xs)
    if not n:
        return MeanSE(None, None, 0)
    std = statistics.stdev(xs) if n > 1 else None
    return MeanSE(
        statistics.mean(xs), None if std is None else std / math.sqrt(n), n, std
    )  # exact mean, as before


@dataclass(frozen=True)
class Gap:
    """A difference (a minus b) with its standard error, and the words the 2-SE rule allows for it."""

    diff: float | None
    se: float | None

    @property
    def z(self) -> float | None:
        """|diff| in standard errors (None without a spread)."""
        if self.diff is None or self.se is None:
            return None
        if self.se == 0:
            return 0.0 if self.diff == 0 else math.inf
        return abs(self.diff) / self.se

    @property
    def separated(self) -> bool | None:
        """|diff| >= SEPARATED_AT_SE x SE; None without a spread (one run, or a missing cell)."""
        return None if self.z is None else self.z >= SEPARATED_AT_SE

    def side(self, up: str = "ahead", down: str = "behind", level: str = "not separated") -> str:
        """`up`/`down` only when separated; `level` otherwise (including no spread yet)."""
        if not self.separated:
            return level
        return up if self.diff > 0 else down

    def text(self, signed: bool = True) -> str:
        """'+0.03 ± 0.02, 1.5 SE' (or '+0.03, no spread yet')."""
        if self.diff is None:
            return "missing"
        head = f"{self.diff:+.2f}" if signed else f"{abs(self.diff):.2f}"
        if self.se is None:
            return f"{head}, no spread yet"
        z = self.z
        return f"{head} ± {self.se:.2f}, " + ("no spread" if self.se == 0 else f"{z:.1f} SE")


def difference(a: MeanSE, b: MeanSE) -> Gap:
    """a - b between two separate cells (unpaired)."""
    if a.mean is None or b.mean is None:
        return Gap(None, None)
    se = math.sqrt(a.se**2 + b.se**2) if a.se is not None and b.se is not None else None
    return Gap(a.mean - b.mean, se)


def gap_of(a: Mapping, b: Mapping) -> Gap:
    """`difference` of two cells given as results-file rows (their n, mean and se, as `MeanSE.row` writes them)."""
    return difference(MeanSE(a["mean"], a["se"], a["n"]), MeanSE(b["mean"], b["se"], b["n"]))


def paired(a: Mapping[int, float], b: Mapping[int, float]) -> Gap:
    """Mean of a[s] - b[s] over the seeds both have, with the SE of those differences."""
    m = mean_se(a[s] - b[s] for s in sorted(a) if s in b)
    return Gap(m.mean, m.se)


# -- time to a target, per-seed ratios ----------------------------------------------------------------------


def time_to(curve: Curve, target: float) -> float | None:
    """Time of the first point at or above `target` (None if the curve never gets there)."""
    return next((t for t, a in curve if a >= target - EPS), None)


def accuracy_at(curve: Curve, budget_s: float) -> float:
    """Accuracy of the last point reached within `budget_s` (the first point's if none)."""
    reached = [a for t, a in curve if t <= budget_s + EPS]
    return reached[-1] if reached else curve[0][1]


def ratio(num: float | None, den: float | None) -> float | None:
    """num / den, None when either is missing or den is 0."""
    return None if num is None or den is None or den == 0 else num / den


def median_or_none(xs: Iterable[float | None]) -> float | None:
    """Median of the values present; None when fewer than half of the entries have one (most seeds failed)."""
    xs = list(xs)
    present = [x for x in xs if x is not None]
    return statistics.median(present) if present and 2 * len(present) >= len(xs) else None


def speedup_per_seed(
    baseline: Mapping[int, float | None], candidate: Mapping[int, float | None]
) -> dict[int, float | None]:
    """baseline time / candidate time seed by seed. A candidate that never reached the target gets 0.0 (it is
    not faster by any factor); a baseline that never reached it leaves the ratio undefined (None)."""
    out: dict[int, float | None] = {}
    for seed in sorted(baseline):
        b, c = baseline[seed], candidate.get(seed)
        out[seed] = None if b is None else (0.0 if c is None else ratio(b, c))
    return out


def median_speedup(
    baseline: Mapping[int, float | None], candidate: Mapping[int, float | None]
) -> tuple[float | None, list[float | None]]:
    """(median of the per-seed ratios present, the per-seed ratios in seed order): the one way a speed-up over
    seeds is stated."""
    per = speedup_per_seed(baseline, candidate)
    present = [x for x in per.values() if x is not None]
    return (statistics.median(present) if present else None), list(per.values())


def spread(xs: Iterable[float | None]) -> dict[str, float | None]:
    """median, min and max of the values present (None when there are none)."""
    present = sorted(x for x in xs if x is not None)
    if not present:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(present), "min": present[0], "max": present[-1]}


def sooner(x: float) -> str:
    """A time-to-target ratio in the direction it points: '1.40× sooner', or '1.45× later (0.69× sooner)'."""
    return f"{x:.2f}× sooner" if x >= 1 else f"{1 / x:.2f}× later ({x:.2f}× sooner)"
