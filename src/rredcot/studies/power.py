"""The power of the claims' comparisons: what this run could resolve, and the study size that would
resolve more.

For each accuracy comparison (``power_table``): the spread over seeds and problems, the smallest
effect the run could detect, and the seeds a ±``POWER_HALF_WIDTH`` interval needs. For each
correlation behind a claim (``correlation_power``): its interval's half-width, its design effect
against independent pairs, and the pairs, traces or problems a ±``CORRELATION_HALF_WIDTH`` interval
needs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import polars as pl

from rredcot.infra.stats import Z95, abs_interval, fisher_interval, verdict_by_size
from rredcot.studies.claims import (
    ACCURACY_THRESHOLD,
    CORRELATION_DIFFERENCE_THRESHOLD,
    correlation_interval,
    finite,
    prm_score_rows,
    rredcot_mc_rows,
)

POWER_HALF_WIDTH = 0.01
"""A powered run resolves a +0.02 accuracy difference with a 95% interval no wider than ±0.01."""
Z80 = 0.8416212335729143  # one-sided z of 80% power


@dataclass
class Power:
    """What one accuracy comparison could resolve."""

    arm: str
    seeds: int
    problems: int
    seed_sd: float | None  # sd over seeds of each seed's mean difference
    problem_sd: float | None  # sd over problems of the differences within a seed
    half_width: float | None  # of the 95% interval of the final difference
    detectable: float | None  # smallest true difference found > 0 with 80% power
    detectable_by_size: float | None  # ... found beyond the threshold with 80% power
    seeds_needed: int | None  # for a half-width of POWER_HALF_WIDTH at these problems
    seeds_to_decide: int | None = None  # for a verdict by size, if the difference stayed as measured

    @property
    def powered(self) -> bool:
        return self.half_width is not None and self.half_width <= POWER_HALF_WIDTH


def seeds_to_decide(diff: float | None, half_width: float | None, seeds: int) -> int | None:
    """The seeds at which a difference that stayed at ``diff`` would get a verdict by size: its interval
    beyond the threshold (``|diff| > threshold``) or inside ±threshold (``|diff| < threshold``), the
    half-width shrinking as one over the root of the seeds from ``half_width`` at ``seeds``. None
    when it cannot (a difference on the threshold itself) or nothing is known."""
    if diff is None or half_width is None or half_width <= 0 or seeds < 1:
        return None
    margin = abs(abs(diff) - ACCURACY_THRESHOLD)
    if margin < 1e-9:
        return None
    return max(2, math.ceil(seeds * (half_width / margin) ** 2))


def power_table(paired: pl.DataFrame) -> list[Power]:
    """Per arm (final sampled accuracy against the reference): the spread, the interval's half-width,
    the minimum detectable effect (5% two-sided, 80% power: (1.96 + 0.84) standard errors, the error
    read off the bootstrap interval) and the seeds a ±POWER_HALF_WIDTH interval needs (normal
    approximation from the two spreads)."""
    out = []
    sampled = paired.filter(pl.col("metric") == "sampled")
    first = sampled["reference"][0] if not sampled.is_empty() else None  # the run's first arm
    for row in sampled.iter_rows(named=True):
        low, high = finite(row["diff_low"]), finite(row["diff_high"])
        half = None if low is None or high is None else (high - low) / 2
        se = None if half is None else half / Z95
        between, within = finite(row.get("seed_sd")), finite(row.get("problem_sd"))
        needed = None
        if between is not None and within is not None:
            per_seed = between**2 + within**2 / max(int(row["problems"]), 1)
            needed = max(2, math.ceil(Z95**2 * per_seed / POWER_HALF_WIDTH**2))
        out.append(
            Power(
                row["arm"] if row["reference"] == first else f"{row['arm']} - {row['reference']}",
                int(row["seeds"]),
                int(row["problems"]),
                between,
                within,
                half,
                None if se is None else (Z95 + Z80) * se,
                None if se is None else ACCURACY_THRESHOLD + (Z95 + Z80) * se,
                needed,
                seeds_to_decide(finite(row["diff"]), half, int(row["seeds"])),
            )
        )
    return out


CORRELATION_HALF_WIDTH = 0.1
"""A correlation claim is powered when its 95% interval is no wider than ±0.1: enough to tell a
moderate agreement (the 0.3 line) from a strong one."""


def fisher_half_width(rho: float, n: int) -> float:
    """The wider side of the Fisher interval of ``rho`` over ``n`` pairs."""
    low, high = fisher_interval(rho, n)
    return max(rho - low, high - rho)


def fewest_pairs(holds: Callable[[int], bool], cap: int = 10**7) -> int | None:
    """The fewest pairs (at least 4) from which ``holds`` is true, for a condition that stays true once
    it is (an interval that narrows as the pairs grow): doubling, then bisection. None beyond ``cap``."""
    hi = 8
    while not holds(hi):
        if hi > cap:
            return None
        hi *= 2
    lo = hi // 2
    while lo + 1 < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if holds(mid) else (mid, hi)
    return max(hi, 4)


def correlation_n(rho: float, half_width: float = CORRELATION_HALF_WIDTH) -> int | None:
    """The fewest pairs whose Fisher interval around ``rho`` (``fisher_interval``) is at most
    ``half_width`` on each side; None for a correlation that is not finite."""
    if not math.isfinite(rho):
        return None
    return fewest_pairs(lambda n: fisher_half_width(rho, n) <= half_width)


def difference_n(a: float, b: float, threshold: float = CORRELATION_DIFFERENCE_THRESHOLD) -> int | None:
    """The fewest pairs (each correlation over as many) at which ``|a| - |b|``, with the two Fisher
    half-widths combined as ``prm_claim`` combines its intervals, gets a verdict by size against
    ±``threshold``, if the correlations stayed as measured; None where the difference sits on the line."""
    a, b = abs(a), abs(b)
    if not (math.isfinite(a) and math.isfinite(b)) or abs(abs(a - b) - threshold) < 1e-9:
        return None

    def decided(n: int) -> bool:
        h = math.hypot(fisher_half_width(a, n), fisher_half_width(b, n))
        return verdict_by_size(a - b - h, a - b + h, threshold) != "inconclusive"

    return fewest_pairs(decided)


def design_effect(rho: float, n: int, low: float, high: float) -> float:
    """How many times the pairs a correlation needs, against independent ones: the squared ratio of its
    bootstrap interval's half-width to the Fisher interval's at the same ρ and n (at least 1; NaN
    where either interval is missing)."""
    fisher = fisher_half_width(rho, n)
    boot = max(rho - low, high - rho)
    if not (math.isfinite(fisher) and math.isfinite(boot)) or fisher <= 0:
        return math.nan
    return max(1.0, (boot / fisher) ** 2)


def pairs_on_problems(independent: int, problems: int, icc: float) -> int | None:
    """The pairs, drawn over these ``problems``, that are worth ``independent`` independent ones when
    pairs of one problem correlate by ``icc``: N / (1 + (N / problems - 1) icc) ≥ independent. None when
    no N is (the limit of more pairs on the same problems is problems / icc)."""
    if icc <= 0 or independent <= problems:  # at most one pair a problem: independent pairs
        return independent
    if independent * icc >= problems:
        return None
    return max(independent, math.ceil(independent * (1 - icc) / (1 - independent * icc / problems)))


@dataclass
class CorrelationPower:
    """What one correlation of a claim could resolve, and the study size that would.

    Pairs of one problem (segments of a trace, traces drawn for the same problem) are not independent.
    The design effect (``design_effect``) says by how much; read as ``1 + (m - 1) icc`` over clusters of
    m pairs (m: this run's pairs per problem), it gives the intra-problem correlation ``icc``. More traces
    of the same problems raise m and with it the design effect, so what a study can resolve on them is
    bounded (``pairs_on_problems``); more problems at this run's traces per problem keep it as measured."""

    claim: str
    what: str
    rho: float
    n: int
    problems: int  # distinct problems behind the pairs (0: unknown)
    half_width: float  # of its 95% interval by the bootstrap over problems
    design_effect: float  # NaN when unknown
    n_independent: int | None  # independent pairs for a ±CORRELATION_HALF_WIDTH interval (or separation)
    n_needed: int | None  # pairs on these problems that give it (None: out of their reach)
    traces_needed: int | None  # traces (of these problems) that give them, at this run's pairs per trace
    problems_needed: int | None  # problems at this run's pairs per problem that give it

    @property
    def powered(self) -> bool:
        return self.half_width <= CORRELATION_HALF_WIDTH

    @property
    def icc(self) -> float:
        per_problem = self.n / self.problems if self.problems else math.nan
        if not (math.isfinite(self.design_effect) and per_problem > 1):
            return math.nan
        return max(0.0, (self.design_effect - 1) / (per_problem - 1))


def correlation_power(
    attribution: pl.DataFrame, prm: pl.DataFrame, n_traces: int, prm_traces: int | None = None
) -> list[CorrelationPower]:
    """The correlations behind ``rredcot_tracks_mc`` (the late one and over all segments) and
    ``prm_follows_thought_nll`` (PRM score against Δ thought and Δ answer NLL): each one's interval and
    pairs, the independent pairs a ±CORRELATION_HALF_WIDTH interval needs (for the PRM claim, or the
    pairs at which the difference of the two gets a verdict by size, ``difference_n``, if the
    correlations stayed as measured, whichever is more),
    and what gives them: pairs and analysis traces (``studies.n_traces``, at this run's pairs per trace)
    drawn over the same problems, or problems at this run's traces per problem. See CorrelationPower.
    ``prm_traces``: the traces the PRM study scored, when not the analysis traces (one each of
    ``studies.prm.analysis_problems`` fresh problems)."""
    out = []

    def row(
        claim: str,
        what: str,
        r: Mapping[str, Any],
        rho: float,
        interval: tuple[float, float],
        need: int | None,
    ) -> CorrelationPower:
        n, problems = int(r["n"]), int(r.get("clusters") or 0)
        traces = prm_traces if prm_traces and claim == "prm_follows_thought_nll" else n_traces
        low, high = interval
        half = max(rho - low, high - rho) if math.isfinite(low) and math.isfinite(high) else math.inf
        deff = design_effect(rho, n, low, high)
        power = CorrelationPower(claim, what, rho, n, problems, half, deff, need, None, None, None)
        if need is None or n <= 0:
            return power
        if not (problems and math.isfinite(power.icc)):  # no clusters known: pairs counted as independent
            power.n_needed = need
        else:
            power.n_needed = pairs_on_problems(need, problems, power.icc)
            power.problems_needed = math.ceil(need * deff / (n / problems))
        if power.n_needed is not None:
            power.traces_needed = math.ceil(traces * power.n_needed / n)
        return power

    pair = rredcot_mc_rows(attribution)
    if not pair.is_empty():
        for r in (pair.row(0, named=True), pair.row(-1, named=True)):
            rho = float(r["spearman"])
            where = f"last {r['fraction']:.0%} of the thinking" if r["fraction"] < 1 else "all segments"
            what = f"Spearman(RREDCoT, MC), {where}"
            out.append(row("rredcot_tracks_mc", what, r, rho, correlation_interval(r), correlation_n(rho)))
    found = prm_score_rows(prm) if not prm.is_empty() else {}
    thought, answer = found.get("d_thought_nll"), found.get("d_answer_nll")
    if thought is not None and answer is not None:
        t, a = abs(float(thought["spearman"])), abs(float(answer["spearman"]))
        if math.isfinite(t) and math.isfinite(a):
            apart = difference_n(t, a)
            for name, rho, r in (("Δ thought NLL", t, thought), ("Δ answer NLL", a, answer)):
                need = max(filter(None, (correlation_n(rho), apart)), default=None)
                interval = abs_interval(*correlation_interval(r))
                out.append(row("prm_follows_thought_nll", f"|Spearman(PRM, {name})|", r, rho, interval, need))
    return out
