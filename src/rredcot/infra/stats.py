"""Intervals and what they say.

Paired comparisons of training arms: bootstrap intervals of accuracy differences and of the steps
an arm needs to reach a reference arm's final accuracy, and the same against training seconds
(accuracy at equal compute, the share of the reference's cost at which the arm reaches it).

Arms are paired by seed (same start model, same prompt order) and evaluated on the same problems, so
a difference is taken seed by seed and problem by problem. Intervals come from a two-level
percentile bootstrap: seeds are drawn with replacement, then problems, with the same draws for both
arms, so the interval holds both the seed-to-seed spread of training and the sampling of the test
problems.

The project's one bootstrap: these intervals, and the studies' intervals over problems
(:class:`ClusterBootstrap`: whole problems drawn with replacement, every method read on the same
draws). Ours, not scipy.stats.bootstrap: it resamples one level of observations for one statistic
at a time and reads linear-interpolated percentiles, while these draw two levels from one fixed
generator, share the draws across arms and methods for paired differences, and read order
statistics (a draw may be inf: a curve that never reaches its target); the recorded results depend
on exactly these draws. The draws themselves are scipy's (``resample``: one ``integers`` call).

Closed-form intervals (a rank correlation's by Fisher z, a fraction's by Wilson, ``|ρ|``'s from
``ρ``'s) and the verdicts that judge an interval against a line: by size, above a target, or as
non-inferiority.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
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


MIN_CLUSTERS = 5
"""Fewer problems than this give no interval over problems: a bootstrap over so few says nothing."""


def resample(rng: np.random.Generator, n: int, n_boot: int) -> np.ndarray:
    """``n_boot`` bootstrap draws of ``n`` units: a [n_boot, n] array of indices drawn with
    replacement, in one call on ``rng`` (the call scipy.stats.bootstrap makes)."""
    return rng.integers(0, n, size=(n_boot, n))


class ClusterBootstrap:
    """Draws of whole clusters (problems) with replacement, the same for every statistic read on them.

    ``clusters`` gives each observation's cluster (e.g. a trace's problem); clusters are numbered in
    the sorted order of their names (``str``), and ``n_boot`` draws of as many clusters are made from
    ``np.random.default_rng(seed)``. A statistic is read on a draw's observations
    (:meth:`rows`) or as a weighted sum with each observation counted as often as its cluster was
    drawn (:attr:`weights`)."""

    def __init__(self, clusters: Sequence[object], n_boot: int, seed: int) -> None:
        names, codes = np.unique(np.asarray(clusters, dtype=object).astype(str), return_inverse=True)
        self.names: list[str] = [str(n) for n in names]
        self.codes = codes.reshape(-1)
        """Each observation's cluster number."""
        self.draws = resample(np.random.default_rng(seed), len(names), n_boot)
        """[n_boot, clusters]: the clusters of each draw."""
        self.counts = np.stack([np.bincount(d, minlength=len(names)) for d in self.draws])
        """[n_boot, clusters]: how often each draw holds each cluster."""
        self.enough = len(names) >= MIN_CLUSTERS
        """Whether there are clusters enough for an interval."""

    @property
    def weights(self) -> np.ndarray:
        """[n_boot, observations]: how often each draw counts each observation (float)."""
        return self.counts[:, self.codes].astype(float)

    def rows(self, codes: np.ndarray | None = None) -> list[np.ndarray]:
        """Per draw, the indices of the items of its clusters, cluster after cluster in the draw's order,
        each cluster's items in their order. ``codes``: the cluster number of each item (default: the
        observations themselves; e.g. the trace's number repeated for each of its segments)."""
        codes = self.codes if codes is None else np.asarray(codes)
        order = np.argsort(codes, kind="stable")
        members = np.split(order, np.cumsum(np.bincount(codes, minlength=len(self.names)))[:-1])
        return [np.concatenate([members[c] for c in d]) for d in self.draws]


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
    seeds = resample(rng, n_seeds, n_boot)
    problems = resample(rng, n_problems, n_boot)
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
    # One draw per call, as the recorded intervals were drawn (one [n_boot, n] call draws others).
    draws = np.array([reach(resample(rng, a.shape[0], 1)[0]) for _ in range(n_boot)])
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
    draws = per_seed[resample(rng, len(per_seed), n_boot)].mean(axis=1)
    return Interval(float(per_seed.mean()), *_percentiles(draws, level))


def seed_sd(arm: np.ndarray, reference: np.ndarray) -> tuple[float, float]:
    """The spread of a paired difference of [seeds, problems] scores: the sd over seeds of each seed's
    mean difference, and the sd over problems of the differences within a seed (root mean of the
    seeds' variances). Their squares over the counts make the variance of the mean difference
    (docs/testbed.md, "The powered recipe")."""
    diff = np.asarray(arm, dtype=np.float64) - np.asarray(reference, dtype=np.float64)
    between = float(diff.mean(axis=1).std(ddof=1)) if diff.shape[0] > 1 else math.nan
    within = float(np.sqrt(diff.var(axis=1, ddof=1).mean())) if diff.shape[1] > 1 else math.nan
    return between, within


# ------------------------------------------------------------------------- accuracy against compute
# Arms differ in what a step costs (Monte Carlo credit generates rollouts, RREDCoT scores exit
# points), so a learning curve per step hides what an arm paid for its accuracy. The functions below
# put each seed's curve on its own training seconds: probe step s sits at the sum of the step times
# of steps 1..s.


STALL_FACTOR = 10.0
"""A step that took more than this many times its run's median step was stalled, not working: a job
suspended (SLURM suspends with SIGSTOP, and a paused process's clock runs on) or starved. Its seconds
are not the method's cost."""


def without_stalls(
    step_time: Mapping[int, float], factor: float = STALL_FACTOR
) -> tuple[dict[int, float], list[int]]:
    """``step_time`` with each stalled step (over ``factor`` times the run's median step) counted at the
    median step, and the steps so counted. A step's own work is unknown once its clock includes a stall;
    the median is what a step of the run takes."""
    if not step_time:
        return {}, []
    median = float(np.median(list(step_time.values())))
    stalled = sorted(k for k, t in step_time.items() if t > factor * median)
    return {k: (median if t > factor * median else float(t)) for k, t in step_time.items()}, stalled


def cumulative_seconds(step_time: Mapping[int, float], steps: Sequence[int]) -> np.ndarray:
    """Training seconds up to each of ``steps``: the sum of the times of optimizer steps 1..s (step 0,
    before any update, sits at 0 s). ``step_time`` maps a step (1, 2, ...) to its seconds; a step
    that is missing would make the cost look smaller than it was, so it is an error."""
    out = []
    for s in steps:
        missing = [k for k in range(1, int(s) + 1) if k not in step_time]
        if missing:
            raise ValueError(f"no step time for step(s) {missing[:5]} (of the {len(missing)} up to step {s})")
        out.append(float(sum(step_time[k] for k in range(1, int(s) + 1))))
    return np.array(out, dtype=np.float64)


def seconds_to_reach(seconds: Sequence[float], curve: Sequence[float], target: float) -> float:
    """The training seconds at which ``curve`` (accuracies at ``seconds``) first reaches ``target``,
    linearly interpolated between the probe before and the probe at which it does (inf if never)."""
    x, y = np.asarray(seconds, dtype=np.float64), np.asarray(curve, dtype=np.float64)
    reached = np.flatnonzero(y >= target - 1e-12)
    if not len(reached):
        return math.inf
    i = int(reached[0])
    if i == 0:
        return float(x[0])
    # y[i - 1] < target <= y[i]: the crossing lies on the segment between the two probes.
    return float(x[i - 1] + (target - y[i - 1]) / (y[i] - y[i - 1]) * (x[i] - x[i - 1]))


def _timed_curves(seconds: np.ndarray, curves: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray]:
    """``seconds`` and ``curves`` as float64 [seeds, probes] arrays of one shape, or ValueError."""
    x, y = np.asarray(seconds, dtype=np.float64), np.asarray(curves, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 2 or 0 in x.shape:
        raise ValueError(
            f"{what}: need [seeds, probes] seconds and curves of one shape, got {x.shape} and {y.shape}"
        )
    if (np.diff(x, axis=1) < 0).any():
        raise ValueError(f"{what}: training seconds must not decrease along a curve")
    return x, y


def _timed_pair(
    arm_seconds: np.ndarray, arm: np.ndarray, reference_seconds: np.ndarray, reference: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    xa, ya = _timed_curves(arm_seconds, arm, "arm")
    xr, yr = _timed_curves(reference_seconds, reference, "reference")
    if xa.shape[0] != xr.shape[0]:
        raise ValueError(f"need the same seeds for both arms, got {xa.shape[0]} and {xr.shape[0]}")
    if (xr[:, -1] <= 0).any():
        raise ValueError("every reference run needs some training seconds to compare against")
    return xa, ya, xr, yr


def cost_shares(arm_seconds: np.ndarray, reference_seconds: np.ndarray) -> tuple[float, float, float]:
    """The mean over seeds of each arm's total training seconds (its last probe's), and the mean over
    seeds of the arm's total over the reference's of the same seed.

    Both are [seeds, probes] cumulative seconds of the same seeds (the probes may differ)."""
    a, r = np.asarray(arm_seconds, dtype=np.float64), np.asarray(reference_seconds, dtype=np.float64)
    if a.ndim != 2 or r.ndim != 2 or a.shape[0] != r.shape[0] or 0 in a.shape + r.shape:
        raise ValueError(f"need [seeds, probes] seconds of the same seeds, got {a.shape} and {r.shape}")
    if (r[:, -1] <= 0).any():
        raise ValueError("every reference run needs some training seconds to compare against")
    return float(a[:, -1].mean()), float(r[:, -1].mean()), float((a[:, -1] / r[:, -1]).mean())


def equal_compute_difference(
    arm_seconds: np.ndarray,
    arm: np.ndarray,
    reference_seconds: np.ndarray,
    reference: np.ndarray,
    n_boot: int,
    seed: int,
    level: float = 0.95,
) -> Interval:
    """The arm's accuracy minus the reference's at equal training compute, with a bootstrap interval
    over seeds.

    Per seed, the compute both arms spent is C = min(arm total, reference total) seconds; each curve
    is linearly interpolated at C (so the cheaper arm is read at its end and the dearer one part way),
    and the difference is averaged over seeds. ``arm_seconds``/``arm`` and
    ``reference_seconds``/``reference`` are [seeds, probes] cumulative seconds and accuracies of the
    same seeds, row by row; the two arms may be probed at different steps."""
    xa, ya, xr, yr = _timed_pair(arm_seconds, arm, reference_seconds, reference)
    _check_level(level, n_boot)
    per_seed = np.array(
        [
            np.interp(c, xa[k], ya[k]) - np.interp(c, xr[k], yr[k])
            for k, c in enumerate(np.minimum(xa[:, -1], xr[:, -1]))
        ]
    )
    rng = np.random.default_rng(seed)
    draws = per_seed[resample(rng, len(per_seed), n_boot)].mean(axis=1)
    return Interval(float(per_seed.mean()), *_percentiles(draws, level))


def reach_share(
    arm_seconds: np.ndarray,
    arm: np.ndarray,
    reference_seconds: np.ndarray,
    reference: np.ndarray,
    n_boot: int,
    seed: int,
    level: float = 0.95,
) -> Interval:
    """The share of the reference's training seconds at which the arm reaches the reference's final
    accuracy, with a paired bootstrap interval over seeds (inf: not reached within the arm's run).

    As :func:`steps_to_reach_reference` does with steps, the arm's curve is its seed mean: at each of
    its probe steps, the mean accuracy over seeds at the mean cumulative seconds over seeds (the seeds
    of an arm share their probe steps). Averaging curves before looking for the crossing keeps one
    noisy seed from deciding it. The target is the reference's final seed-mean accuracy; the seconds
    at which the arm's mean curve first reaches it (linearly interpolated between probes) are divided
    by the reference's mean total seconds. 0.5: the arm reaches the reference's final accuracy at
    half the reference's cost. Arguments as in :func:`equal_compute_difference`."""
    xa, ya, xr, yr = _timed_pair(arm_seconds, arm, reference_seconds, reference)
    _check_level(level, n_boot)

    def share(idx: np.ndarray) -> float:
        reached = seconds_to_reach(xa[idx].mean(axis=0), ya[idx].mean(axis=0), float(yr[idx, -1].mean()))
        return reached / float(xr[idx, -1].mean())

    rng = np.random.default_rng(seed)
    n = xa.shape[0]
    draws = np.array([share(resample(rng, n, 1)[0]) for _ in range(n_boot)])  # one draw per call
    return Interval(share(np.arange(n)), *_percentiles(draws, level))


# ----------------------------------------------------------- closed-form intervals and verdicts

Z95 = 1.959963984540054
"""The two-sided 95% quantile of the standard normal."""


def fisher_interval(rho: float, n: int) -> tuple[float, float]:
    """95% interval of a Spearman correlation (Fisher z, Fieller's variance 1.06 / (n - 3))."""
    if n < 4 or not math.isfinite(rho):
        return math.nan, math.nan
    z = math.atanh(max(min(rho, 0.999999), -0.999999))
    half = Z95 * math.sqrt(1.06 / (n - 3))
    return math.tanh(z - half), math.tanh(z + half)


def abs_interval(low: float, high: float) -> tuple[float, float]:
    """The interval of ``|ρ|`` from that of ``ρ``: mirrored when it lies below 0, from 0 when it spans it."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return math.nan, math.nan
    if low >= 0:
        return low, high
    if high <= 0:
        return -high, -low
    return 0.0, max(-low, high)


def wilson_interval(fraction: float, n: int) -> tuple[float, float]:
    """95% Wilson interval of a binomial fraction over ``n`` trials."""
    if n <= 0:
        return math.nan, math.nan
    z2 = Z95 * Z95
    centre = (fraction + z2 / (2 * n)) / (1 + z2 / n)
    half = Z95 * math.sqrt(fraction * (1 - fraction) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def verdict_by_size(low: float | None, high: float | None, threshold: float, line: float = 0.0) -> str:
    """Judge an interval against ``line ± threshold``: ``supported`` beyond ``line + threshold``,
    ``contradicted`` beyond ``line - threshold``, ``too small to matter`` inside both, else
    ``inconclusive``."""
    if low is None or high is None or math.isnan(low) or math.isnan(high):
        return "inconclusive"
    if low > line + threshold:
        return "supported"
    if high < line - threshold:
        return "contradicted"
    if low > line - threshold and high < line + threshold:
        return "too small to matter"
    return "inconclusive"


def verdict_above(low: float | None, high: float | None, line: float = 0.0) -> str:
    """``supported`` when the interval lies above ``line``, ``contradicted`` when below, else
    inconclusive (a target rather than an effect size: the threshold is the line itself)."""
    if low is None or high is None or math.isnan(low) or math.isnan(high):
        return "inconclusive"
    if low > line:
        return "supported"
    if high < line:
        return "contradicted"
    return "inconclusive"


def verdict_not_below(low: float | None, high: float | None, threshold: float) -> str:
    """Non-inferiority: ``supported`` when the interval lies above ``-threshold`` (the arm is at most a
    difference that does not matter behind, or ahead), ``contradicted`` when it lies below it, else
    ``inconclusive``: ``verdict_above`` with ``-threshold`` for the line."""
    return verdict_above(low, high, -threshold)
