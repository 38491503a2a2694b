"""Paired comparisons of training arms: bootstrap intervals of accuracy differences and of the steps
an arm needs to reach a reference arm's final accuracy.

Arms are paired by seed (same start model, same prompt order) and evaluated on the same problems, so
a difference is taken seed by seed and problem by problem. Intervals come from a two-level
percentile bootstrap: seeds are drawn with replacement, then problems, with the same draws for both
arms, so the interval holds both the seed-to-seed spread of training and the sampling of the test
problems. Written here with numpy because the few lines of a paired, two-level resampling are
clearer than fitting them to scipy.stats.bootstrap's one-level interface.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Interval:
    """A point estimate and its percentile bootstrap interval."""

    estimate: float
    low: float
    high: float

    def excludes_zero(self) -> bool:
        return self.low > 0.0 or self.high < 0.0


def _percentiles(draws: np.ndarray, level: float) -> tuple[float, float]:
    tail = (1.0 - level) / 2.0 * 100.0
    # Order statistics, not interpolation: draws may be inf (a curve that never reaches its target).
    low, high = np.percentile(draws, [tail, 100.0 - tail], method="inverted_cdf")
    return float(low), float(high)


def _check_level(level: float, n_boot: int) -> None:
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    if n_boot < 1:
        raise ValueError(f"n_boot must be at least 1, got {n_boot}")


def paired_difference(
    arm: np.ndarray, reference: np.ndarray, n_boot: int, seed: int, level: float = 0.95
) -> Interval:
    """Mean of ``arm - reference`` over seeds and problems, with a two-level paired bootstrap interval.

    Both arrays are [seeds, problems] scores (e.g. 0/1 correctness, or a problem's mean over
    samples) of the same problems under the same seeds.
    """
    a, r = np.asarray(arm, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    if a.shape != r.shape or a.ndim != 2 or 0 in a.shape:
        raise ValueError(f"need two [seeds, problems] arrays of one shape, got {a.shape} and {r.shape}")
    _check_level(level, n_boot)
    diff = a - r
    rng = np.random.default_rng(seed)
    n_seeds, n_problems = diff.shape
    seeds = rng.integers(0, n_seeds, size=(n_boot, n_seeds))
    problems = rng.integers(0, n_problems, size=(n_boot, n_problems))
    draws = diff[seeds[:, :, None], problems[:, None, :]].mean(axis=(1, 2))
    return Interval(float(diff.mean()), *_percentiles(draws, level))


def steps_to_reach(steps: Sequence[float], curve: Sequence[float], target: float) -> float:
    """The first step at which ``curve`` reaches ``target`` (inf if it never does)."""
    for step, value in zip(steps, curve, strict=True):
        if value >= target - 1e-12:
            return float(step)
    return math.inf


def _paired_curves(
    steps: Sequence[float], arm: np.ndarray, reference: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``arm`` and ``reference`` as float64 [seeds, steps] arrays of one shape, or ValueError."""
    a, r = np.asarray(arm, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    if a.shape != r.shape or a.ndim != 2 or a.shape[1] != len(steps) or a.shape[0] == 0:
        raise ValueError(f"need two [seeds, {len(steps)}] curves of one shape, got {a.shape} and {r.shape}")
    return a, r


def steps_to_reach_reference(
    steps: Sequence[float],
    arm: np.ndarray,
    reference: np.ndarray,
    n_boot: int,
    seed: int,
    level: float = 0.95,
) -> Interval:
    """Steps the arm's seed-mean learning curve needs to reach the reference's final seed-mean
    accuracy, with a paired bootstrap over seeds (inf: not reached within the curve).

    ``arm`` and ``reference`` are [seeds, steps] held-out accuracies at ``steps`` (the same seeds).
    """
    a, r = _paired_curves(steps, arm, reference)
    _check_level(level, n_boot)

    def reach(idx: np.ndarray) -> float:
        return steps_to_reach(steps, a[idx].mean(axis=0), float(r[idx, -1].mean()))

    rng = np.random.default_rng(seed)
    every = np.arange(a.shape[0])
    draws = np.array([reach(rng.integers(0, a.shape[0], size=a.shape[0])) for _ in range(n_boot)])
    return Interval(reach(every), *_percentiles(draws, level))


def paired_area(
    steps: Sequence[float],
    arm: np.ndarray,
    reference: np.ndarray,
    n_boot: int,
    seed: int,
    level: float = 0.95,
) -> Interval:
    """The area between two learning curves per step of training: the trapezoidal area of the arm's
    curve minus the reference's, divided by the steps it spans (the mean lead over the run, in
    accuracy), with a paired bootstrap interval over seeds.

    ``arm`` and ``reference`` are [seeds, steps] held-out accuracies at ``steps`` (the same seeds). A
    measure of sample efficiency that uses every probe, not only the last: an arm that learns sooner
    leads for longer."""
    a, r = _paired_curves(steps, arm, reference)
    if len(steps) < 2:
        raise ValueError("an area needs at least two probe steps")
    _check_level(level, n_boot)
    x = np.asarray(steps, dtype=np.float64)
    diff = a - r
    # Per seed: trapezoids between consecutive probes, over the span of the run.
    per_seed = ((diff[:, 1:] + diff[:, :-1]) / 2.0 * np.diff(x)).sum(axis=1) / (x[-1] - x[0])
    rng = np.random.default_rng(seed)
    draws = per_seed[rng.integers(0, len(per_seed), size=(n_boot, len(per_seed)))].mean(axis=1)
    return Interval(float(per_seed.mean()), *_percentiles(draws, level))


def seed_sd(arm: np.ndarray, reference: np.ndarray) -> tuple[float, float]:
    """The spread of a paired difference of [seeds, problems] scores: the sd over seeds of each seed's
    mean difference, and the sd over problems of the differences within a seed (root mean of the
    seeds' variances). Their squares over the counts make the variance of the mean difference
    (docs/METHOD-NOTES.md, "A powered testbed")."""
    diff = np.asarray(arm, dtype=np.float64) - np.asarray(reference, dtype=np.float64)
    between = float(diff.mean(axis=1).std(ddof=1)) if diff.shape[0] > 1 else math.nan
    within = float(np.sqrt(diff.var(axis=1, ddof=1).mean())) if diff.shape[1] > 1 else math.nan
    return between, within
