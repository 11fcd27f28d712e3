"""Pure arithmetic shared by the time-to-accuracy benchmarks (vs_trl.py, async_vs_sync.py): curves, targets,
medians over seeds with missing values, ratios. No I/O, so tests can check it on hand-made cells.

A curve is [(seconds, accuracy), ...] in time order: the warm start at 0 s, then every scored checkpoint.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence

Curve = Sequence[tuple[float, float]]


def time_to(curve: Curve, target: float) -> float | None:
    """Time of the first point at or above `target` (None if the curve never gets there)."""
    return next((t for t, a in curve if a >= target - 1e-9), None)


def accuracy_at(curve: Curve, budget_s: float) -> float:
    """Accuracy of the last point reached within `budget_s` (the warm start's if none)."""
    reached = [a for t, a in curve if t <= budget_s + 1e-9]
    return reached[-1] if reached else curve[0][1]


def median_or_none(xs: Iterable[float | None]) -> float | None:
    """Median of the values present; None when fewer than half of the entries have one (most seeds failed)."""
    xs = list(xs)
    present = [x for x in xs if x is not None]
    return statistics.median(present) if present and 2 * len(present) >= len(xs) else None


def ratio(num: float | None, den: float | None) -> float | None:
    """num / den, None when either is missing or den is 0."""
    return None if num is None or den is None or den == 0 else num / den


def speedup_per_seed(
    baseline: dict[int, float | None], candidate: dict[int, float | None]
) -> dict[int, float | None]:
    """baseline time / candidate time seed by seed. A candidate that never reached the target gets 0.0 (it is
    not faster by any factor); a baseline that never reached it leaves the ratio undefined (None)."""
    out: dict[int, float | None] = {}
    for seed, b in baseline.items():
        c = candidate.get(seed)
        out[seed] = None if b is None else (0.0 if c is None else ratio(b, c))
    return out


def spread(xs: Iterable[float | None]) -> dict[str, float | None]:
    """median, min and max of the values present (None when there are none)."""
    present = sorted(x for x in xs if x is not None)
    if not present:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(present), "min": present[0], "max": present[-1]}
