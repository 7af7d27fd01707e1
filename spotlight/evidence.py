"""The statistics of a comparison a reader can trust: paired seeds, bootstrap intervals, curve
summaries that are less noisy than a first crossing.

Every function is pure. A *paired* ratio compares two modes run on the same run seeds (the same
base model, prompts and validation seeds), so seed-to-seed luck cancels in each pair; the
interval resamples seeds, not runs.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def first_crossing(curve: Sequence[tuple[int, float]], target: float) -> int | None:
    """The first iteration count whose validation reward reaches ``target`` (None: never)."""
    for iteration, reward in curve:
        if reward >= target:
            return int(iteration)
    return None


def crossing(curve: Sequence[tuple[int, float]], target: float) -> float | None:
    """Iterations to ``target``, interpolated linearly between the last validation below it and
    the first at or above it (None: never reached). Validations every few iterations would
    otherwise round every run up to the next validation, hiding differences smaller than that."""
    previous = None
    for iteration, reward in curve:
        if reward >= target:
            if previous is None:
                return float(iteration)
            i0, r0 = previous
            return float(i0 + (target - r0) / (reward - r0) * (iteration - i0))
        previous = (iteration, reward)
    return None


def curve_area(curve: Sequence[tuple[int, float]], until: int) -> float:
    """Mean validation reward over iterations 0..``until`` (the trapezoid area under the curve
    divided by ``until``): one number per run that uses every validation, not only the first
    crossing. The curve is held at its last value after its last point."""
    if until <= 0 or not curve:
        raise ValueError(f"curve_area needs a curve and until > 0 (got {len(curve)} points, "
                         f"until={until})")
    xs = [float(i) for i, _ in curve if i <= until]
    ys = [float(r) for i, r in curve if i <= until]
    if xs[-1] < until:
        xs.append(float(until))
        ys.append(ys[-1])
    return float(np.trapezoid(ys, xs) / until)


def value_at(curve: Sequence[tuple[int, float]], iteration: int) -> float | None:
    """The validation reward measured at ``iteration`` (None if not validated there)."""
    for i, reward in curve:
        if i == iteration:
            return float(reward)
    return None


def paired_ratios(numerator: Sequence[float | None],
                  denominator: Sequence[float | None]) -> list[float]:
    """Per seed ``numerator / denominator`` (e.g. vanilla's iterations to target over
    spotlight's: the speed-up). A run that never reached the target counts as reaching it
    just after its budget, so pass the budget + 1 instead of None where that is meant; pairs
    with a None are left out."""
    if len(numerator) != len(denominator):
        raise ValueError(f"paired ratios need the same seeds: {len(numerator)} against "
                         f"{len(denominator)}")
    return [float(a) / float(b) for a, b in zip(numerator, denominator)
            if a is not None and b is not None and b > 0]


def bootstrap_median(values: Sequence[float], level: float = 0.90, resamples: int = 10_000,
                     seed: int = 0) -> dict:
    """``{"median", "ci90": [lo, hi], "per_seed"}``: the median of ``values`` and a percentile
    bootstrap interval of it (resampling seeds with replacement). With fewer than two values
    the interval is the value itself -- no spread was measured, and the reader should see it."""
    values = [float(v) for v in values]
    key = f"ci{round(level * 100)}"
    if not values:
        return {"median": None, key: [None, None], "per_seed": []}
    median = float(np.median(values))
    if len(values) < 2:
        return {"median": median, key: [median, median], "per_seed": values}
    rng = np.random.default_rng(seed)
    draws = rng.choice(np.asarray(values), size=(resamples, len(values)), replace=True)
    medians = np.median(draws, axis=1)
    tail = (1.0 - level) / 2.0
    lo, hi = np.quantile(medians, [tail, 1.0 - tail])
    return {"median": median, key: [float(lo), float(hi)], "per_seed": values}


def quantiles(values: Sequence[float | None], *qs: float) -> list[float | None]:
    """The ``qs`` quantiles of the finite values (None each when there are none)."""
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return [None for _ in qs]
    return [float(q) for q in np.quantile(finite, qs)]


def paired_gain(before: Sequence[float], after: Sequence[float], level: float = 0.90,
                resamples: int = 10_000, seed: int = 0) -> dict:
    """``{"gain", "ci90": [lo, hi]}``: the mean of ``after - before`` over paired samples (the
    same validation prompt and seed before and after training) and a percentile bootstrap
    interval of it, resampling the pairs. Pairing removes the prompts' own difficulty from
    the spread, so a small gain on a few dozen prompts can still be told from noise."""
    if len(before) != len(after):
        raise ValueError(f"paired_gain needs the same samples before and after; got "
                         f"{len(before)} and {len(after)}")
    diffs = np.asarray(after, dtype=float) - np.asarray(before, dtype=float)
    key = f"ci{round(level * 100)}"
    if diffs.size == 0:
        return {"gain": None, key: [None, None]}
    gain = float(diffs.mean())
    if diffs.size < 2:
        return {"gain": gain, key: [gain, gain]}
    rng = np.random.default_rng(seed)
    means = rng.choice(diffs, size=(resamples, diffs.size), replace=True).mean(axis=1)
    tail = (1.0 - level) / 2.0
    lo, hi = np.quantile(means, [tail, 1.0 - tail])
    return {"gain": gain, key: [float(lo), float(hi)]}
