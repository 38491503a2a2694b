"""The paper's claims, each checked against what this run measured: ``claims.csv`` and ``claims.md``.

    rredcot claims --config C --paired paired.csv --cost cost.csv --truncation fig3_truncation.csv \\
        --attribution fig4_attribution_correlation.csv --prm fig5_prm_vs_nll.csv --compute compute.csv \\
        --variance fig7_mc_variance.csv [--localisation localisation.json] [--prm-model PRM_DIR] \\
        --csv claims.csv --md claims.md

One row per claim: the measured value, a 95% interval where the measurement has one, the practical
threshold that says what size of effect matters (and why), and a verdict judged by size:
``supported`` (the interval lies beyond the threshold on the claim's side), ``contradicted`` (beyond
it on the other side), ``too small to matter`` (the interval lies inside ±threshold: whatever the
effect is, it is smaller than what matters) or ``inconclusive`` (none of these: the run cannot tell),
always *on this testbed*. The cost claim says where the measured ratio falls: within the paper's
range, cheaper or dearer. A section on power gives, for each accuracy comparison, the spread over
seeds and problems, the smallest effect the run could detect, and the seeds a ±0.01 interval needs.
Each row names its source file, so a verdict can be traced to the numbers behind it. Rows named
``testbed_*`` check the testbed itself rather than the paper: exact values (the ceiling of credit,
which credits right traces and blames wrong ones from what the task knows, with no sampling noise)
must beat GRPO for the testbed to be
able to judge credit at all; perfect blame (the oracle, the ceiling of blame only) is a finding beside
it; RREDCoT's most-blamed segment should be a wrong trace's culprit. With a Monte Carlo arm, RREDCoT is
also held against it at equal steps and at equal training compute (``compute.csv``), as
non-inferiority: not behind by more than the threshold. A section on the power of the correlations gives
the study size (``studies.n_traces``) a ±0.1 interval needs.

Intervals: paired bootstrap differences and steps-to-reach come from ``paired.csv``; a rank
correlation's comes from its figure's CSV (``spearman_low``, ``spearman_high``): a bootstrap over
problems, since segments of one trace and traces of one problem are not independent pairs. The Fisher-z
interval (Fieller's variance ``1.06 / (n - 3)``), which counts them as independent, only sizes studies:
its width against the bootstrap's gives the design effect that scales the pairs a study needs. A
fraction of rollouts gets the Wilson interval (rollouts counted as independent, which those from the
same exit point are not: the interval is optimistic).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import polars as pl

from rredcot.infra.io import atomic_path
from rredcot.infra.logs import setup_logging
from rredcot.settings.config import active_arms, arm_label
from rredcot.settings.reads import stage_config

_log = logging.getLogger(__name__)

Z95 = 1.959963984540054

# Where a claim says "much larger" or "noisy" it needs a line; these are ours, stated in claims.md.
NOISY_VALUE_SD = 0.1
"""A Monte Carlo value is called noisy when its bootstrap sd from M rollouts exceeds this (values lie
in [0, 1]; 0.1 is a tenth of the whole range)."""
MUCH_LARGER = 2.0
"""MC's cost is "much larger" than RREDCoT's when its step ratio to GRPO is at least this multiple
of RREDCoT's."""
RREDCOT_COST_RANGE = (1.5, 2.0)
"""The paper's stated RREDCoT overhead over GRPO (step time ratio)."""
MIN_TRACES = 5
"""Fewer traces with Monte Carlo values than this say nothing about their noise."""
LOCALISATION_TARGET = 0.7
"""The testbed's target: RREDCoT's most-blamed segment is a wrong trace's thinking culprit this often."""


@dataclass
class Claim:
    claim: str
    statement: str
    measure: str
    value: float | None
    low: float | None
    high: float | None
    verdict: str
    source: str
    note: str = ""
    threshold: str = ""  # the size that matters, and why


ACCURACY_THRESHOLD = 0.005
"""An accuracy difference matters from half a point on: RL adds about +0.11 in 20 steps on the
default, the paper's gains are 1-3 points, and a smaller difference would not choose a method for
anyone (it is also below one seed's evaluation noise)."""
CORRELATION_THRESHOLD = 0.3
"""A rank correlation matters from 0.3 on (a moderate agreement); below it two credit signals rank
segments alike too rarely to stand in for each other."""
CORRELATION_DIFFERENCE_THRESHOLD = 0.05
"""Two correlations with one signal (the PRM's score against Δ thought NLL and against Δ answer NLL)
differ in a way that matters from 0.05 in |ρ| on: a sixth of the 0.3 line, and a share of ranked
segments that no reading of the PRM would change with."""
TRUNCATION_THRESHOLD = 0.05
"""Truncation matters when it loses at least 5% of the rollouts that would be correct: a value
biased by that much changes the sign of small segment rewards."""
PRM_MIN_SKILL = CORRELATION_THRESHOLD**2
"""A PRM stands for step correctness only when it has learned step values: its Brier skill on held-out
problems (1 - its Brier score / the constant training mean's) is at least this, the share of the
values' variance that a moderate correlation (``CORRELATION_THRESHOLD``) explains. Below it the PRM's
scores are close to a constant plus noise, and which way they lean changes with its training seed."""
POWER_HALF_WIDTH = 0.01
"""A powered run resolves a +0.02 accuracy difference with a 95% interval no wider than ±0.01."""
Z80 = 0.8416212335729143  # one-sided z of 80% power


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


def fisher_interval(rho: float, n: int) -> tuple[float, float]:
    """95% interval of a Spearman correlation (Fisher z, Fieller's variance 1.06 / (n - 3))."""
    if n < 4 or not math.isfinite(rho):
        return math.nan, math.nan
    z = math.atanh(max(min(rho, 0.999999), -0.999999))
    half = Z95 * math.sqrt(1.06 / (n - 3))
    return math.tanh(z - half), math.tanh(z + half)


def correlation_interval(row: Mapping[str, Any]) -> tuple[float, float]:
    """A correlation row's 95% interval, by the bootstrap over problems of the figure that wrote it."""
    if "spearman_low" not in row:
        raise ValueError(
            "the correlation table has no spearman_low/spearman_high columns (drawn before the bootstrap "
            "over problems): redraw its figures with rredcot study-attr-figures"
        )
    low, high = row["spearman_low"], row["spearman_high"]
    return (math.nan, math.nan) if low is None or high is None else (float(low), float(high))


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


def _finite(x: Any) -> float | None:
    try:
        value = float(x)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _paired_row(paired: pl.DataFrame, label: str, metric: str, reference: str) -> dict[str, Any] | None:
    rows = paired.filter(
        (pl.col("arm") == label) & (pl.col("metric") == metric) & (pl.col("reference") == reference)
    ).to_dicts()
    return rows[0] if rows else None


def verdict_not_below(low: float | None, high: float | None, threshold: float) -> str:
    """Non-inferiority: ``supported`` when the interval lies above ``-threshold`` (the arm is at most a
    difference that does not matter behind, or ahead), ``contradicted`` when it lies below it, else
    ``inconclusive``."""
    if low is None or high is None or math.isnan(low) or math.isnan(high):
        return "inconclusive"
    if low > -threshold:
        return "supported"
    if high < -threshold:
        return "contradicted"
    return "inconclusive"


def accuracy_claim(
    paired: pl.DataFrame,
    label: str,
    reference: str,
    claim: str,
    statement: str,
    source: str,
    not_below: bool = False,
    note: str = "",
) -> Claim:
    """An arm's final sampled accuracy minus the reference's, paired by seed and problem; judged by
    size, or (``not_below``) as non-inferiority: at most a difference that does not matter behind."""
    row = _paired_row(paired, label, "sampled", reference)
    if row is None:
        return Claim(
            claim,
            statement,
            f"{label} - {reference}, sampled accuracy",
            None,
            None,
            None,
            "inconclusive",
            source,
            f"{note}; " * bool(note) + f"no paired row for {label} against {reference} (arm not run)",
        )
    low, high = _finite(row["diff_low"]), _finite(row["diff_high"])
    by_size = verdict_by_size(low, high, ACCURACY_THRESHOLD)
    if not_below:
        note = f"{note}; judged by size: {by_size}".lstrip("; ")
    return Claim(
        claim,
        statement,
        f"{label} - {reference}, final sampled held-out accuracy (paired, {row['seeds']} seeds x "
        f"{row['problems']} problems)",
        _finite(row["diff"]),
        low,
        high,
        verdict_not_below(low, high, ACCURACY_THRESHOLD) if not_below else by_size,
        source,
        note,
        f"-{ACCURACY_THRESHOLD} accuracy: behind by less than what would choose a method"
        if not_below
        else f"±{ACCURACY_THRESHOLD} accuracy: half a point, below what would choose a method",
    )


def efficiency_claim(
    paired: pl.DataFrame,
    label: str,
    reference: str,
    last_step: int,
    source: str,
    claim: str = "sample_efficiency",
    not_below: bool = False,
) -> Claim:
    """The arm learns faster: its mean lead over the reference across the run (the area between the
    learning curves per step), judged by size (or, ``not_below``, as non-inferiority); the RL steps it
    needs to reach the reference's final accuracy are reported beside it."""
    statement = (
        f"{label} learns as fast as {reference}: it is not behind over the run"
        if not_below
        else f"{label} learns faster than {reference}: it leads over the run (sample efficiency)"
    )
    row = _paired_row(paired, label, "sampled", reference)
    measure = f"mean lead of {label} over {reference} across the run (area between the learning curves)"
    if row is None or _finite(row.get("area")) is None:
        note = f"no paired row for {label}" if row is None else "no learning curves with two probes or more"
        return Claim(claim, statement, measure, None, None, None, "inconclusive", source, note)
    low, high = _finite(row["area_low"]), _finite(row["area_high"])
    steps = " ".join(
        f"{float(row[k]):.0f}" if row[k] is not None and math.isfinite(float(row[k])) else "inf"
        for k in ("steps_to_reference", "steps_low", "steps_high")
    ).split()
    by_size = verdict_by_size(low, high, ACCURACY_THRESHOLD)
    note = "bootstrap over seeds of each seed's area; inf: not reached within the run"
    return Claim(
        claim,
        statement,
        f"{measure}, sampled probe accuracy; steps to reach {reference}'s final accuracy "
        f"{steps[0]} [{steps[1]}, {steps[2]}] of {last_step}",
        _finite(row["area"]),
        low,
        high,
        verdict_not_below(low, high, ACCURACY_THRESHOLD) if not_below else by_size,
        source,
        f"{note}; judged by size: {by_size}" if not_below else note,
        f"-{ACCURACY_THRESHOLD} accuracy, as for final accuracy"
        if not_below
        else f"±{ACCURACY_THRESHOLD} accuracy, as for final accuracy",
    )


def equal_compute_claim(compute: pl.DataFrame | None, label: str, reference: str, source: str) -> Claim:
    """At equal training compute the arm is not behind the reference (accuracy of both learning curves
    at the seconds of training the cheaper of the two spent, per seed); the share of the reference's
    training seconds the arm needs to reach the reference's final accuracy is reported beside it."""
    claim = "rredcot_matches_mc_at_equal_compute"
    statement = (
        f"At equal training compute {label} is not behind {reference}, and reaches {reference}'s final "
        f"accuracy at a fraction of its cost"
    )
    measure = f"{label} - {reference}, sampled probe accuracy at equal training seconds"
    rows = (
        []
        if compute is None
        else compute.filter((pl.col("arm") == label) & (pl.col("reference") == reference)).to_dicts()
    )
    if not rows:
        note = "no compute.csv" if compute is None else f"no {label} against {reference} (arm not run)"
        return Claim(claim, statement, measure, None, None, None, "inconclusive", source, note)
    row = rows[0]
    low, high = _finite(row["equal_compute_low"]), _finite(row["equal_compute_high"])
    reach = [_finite(row.get(k)) for k in ("reach_share", "reach_low", "reach_high")]
    shown = ["inf" if x is None else f"{x:.2f}" for x in reach]
    return Claim(
        claim,
        statement,
        f"{measure} (per seed, at the training seconds of the cheaper arm; {row['seeds']} seeds); "
        f"{label} trains in {_fmt(_finite(row.get('cost_share')))} of {reference}'s seconds and reaches its "
        f"final accuracy at {shown[0]} [{shown[1]}, {shown[2]}] of them",
        _finite(row["equal_compute_diff"]),
        low,
        high,
        verdict_not_below(low, high, ACCURACY_THRESHOLD),
        source,
        f"judged by size: {verdict_by_size(low, high, ACCURACY_THRESHOLD)}; inf: not reached within the run",
        f"-{ACCURACY_THRESHOLD} accuracy, as for final accuracy",
    )


def tracks_mc_claim(attribution: pl.DataFrame, source: str) -> Claim:
    """RREDCoT's segment rewards rank like Monte Carlo's, and more so for the latest segments."""
    statement = "RREDCoT's segment rewards track Monte Carlo's, most of all late in the trace"
    pair = attribution.filter(
        ((pl.col("method_a") == "rredcot") & (pl.col("method_b") == "mc"))
        | ((pl.col("method_a") == "mc") & (pl.col("method_b") == "rredcot"))
    ).sort("fraction")
    pair = pair.filter(pl.col("spearman").is_not_nan() & (pl.col("n") >= 4))
    if pair.is_empty():
        return Claim(
            "rredcot_tracks_mc",
            statement,
            "Spearman(RREDCoT, MC)",
            None,
            None,
            None,
            "inconclusive",
            source,
            "too few segments with both values",
        )
    late, whole = pair.row(0, named=True), pair.row(-1, named=True)
    low, high = correlation_interval(late)
    whole_low, whole_high = correlation_interval(whole)
    verdict = verdict_by_size(low, high, CORRELATION_THRESHOLD)
    if verdict == "supported" and late["spearman"] <= whole["spearman"]:
        verdict = "inconclusive"  # tracks MC, but not more so late in the trace
    return Claim(
        "rredcot_tracks_mc",
        statement,
        f"Spearman(RREDCoT, MC) over the last {late['fraction']:.0%} of each trace's segments "
        f"(n = {int(late['n'])}); over all segments {whole['spearman']:.3f} "
        f"[{whole_low:.3f}, {whole_high:.3f}] (n = {int(whole['n'])}); 95% intervals by a bootstrap over "
        f"problems",
        float(late["spearman"]),
        low,
        high,
        verdict,
        source,
        "supported needs the late interval above the threshold and the late correlation above the "
        "overall one",
        f"ρ ≥ {CORRELATION_THRESHOLD}: a moderate agreement; below it the rankings agree too rarely",
    )


RELATIVE_TRUNCATIONS = (0.25, 0.5, 0.75, 1.0)
"""Truncation lengths of the truncation claim, as fractions of the testbed's own mean rollout length."""


def truncation_claim(truncation: pl.DataFrame, source: str) -> Claim:
    """Rollouts truncated at half their typical length lose answers they would have got right.

    As Figure 3: the lost share of rollouts that are correct at the budget B, against the truncation
    length T, here at lengths relative to the testbed's own rollouts (their mean length L, read off
    the tokens Figure 3 counts at B), so that the claim means the same on short and long traces."""
    statement = "Truncating Monte Carlo rollouts loses rollouts that would have been correct"
    part = truncation.filter(pl.col("group") == "all").sort("truncation")
    if part.is_empty() or int(part["rollouts"].max()) == 0:
        return Claim(
            "truncated_mc_loses_rollouts",
            statement,
            "lost fraction",
            None,
            None,
            None,
            "inconclusive",
            source,
            "no rollouts",
        )
    budget = part.row(-1, named=True)
    length = budget["tokens_per_point"] * budget["points"] / budget["rollouts"]  # mean rollout length L
    n = int(budget["rollouts"])

    def at(fraction: float) -> dict[str, Any]:
        target = fraction * length
        return min(part.iter_rows(named=True), key=lambda r: (abs(r["truncation"] - target), r["truncation"]))

    curve = ", ".join(
        f"{f:g}L (T = {at(f)['truncation']}): {at(f)['lost_correct']:.3f}" for f in RELATIVE_TRUNCATIONS
    )
    row = at(0.5)
    low, high = wilson_interval(float(row["lost_correct"]), n)
    return Claim(
        "truncated_mc_loses_rollouts",
        statement,
        f"share of {n} rollouts lost at T = {row['truncation']} tokens (half the mean rollout length "
        f"L = {length:.0f}; budget B = {budget['truncation']}) that are correct at B; at {curve}",
        float(row["lost_correct"]),
        low,
        high,
        verdict_by_size(low, high, TRUNCATION_THRESHOLD),
        source,
        "Wilson interval; rollouts from one exit point are correlated, so it is optimistic",
        f"{TRUNCATION_THRESHOLD:.0%} of the rollouts: a value biased by that much flips small rewards",
    )


def noise_claim(variance: pl.DataFrame, samples: int, source: str) -> Claim:
    """Monte Carlo values from M rollouts have a bootstrap sd above NOISY_VALUE_SD."""
    statement = f"Monte Carlo value estimates from few rollouts are noisy (sd > {NOISY_VALUE_SD})"
    if variance.is_empty():
        return Claim(
            "mc_estimates_noisy",
            statement,
            "bootstrap sd of v̂",
            None,
            None,
            None,
            "inconclusive",
            source,
            "no Monte Carlo records",
        )
    m = min(samples, int(variance["samples"].max()))
    rows = variance.filter(pl.col("samples") == m).sort("exit_points")
    traces = int(rows["traces"].max())
    # The most exit points that at least half of the traces have: each cell averages over the first
    # k exit points of the traces that have k.
    row = rows.filter(pl.col("traces") * 2 >= traces).row(-1, named=True)
    sds = rows["value_sd"].to_list()
    value = float(row["value_sd"])
    verdict = "supported" if value > NOISY_VALUE_SD else "contradicted"
    note = f"a line, not an interval: noisy means sd > {NOISY_VALUE_SD} on a value in [0, 1]"
    if traces < MIN_TRACES:
        verdict, note = "inconclusive", f"{traces} traces with Monte Carlo values: too few (< {MIN_TRACES})"
    return Claim(
        "mc_estimates_noisy",
        statement,
        f"mean bootstrap sd of an exit-point value from M = {m} rollouts, over the first "
        f"{int(row['exit_points'])} exit points of {int(row['traces'])} traces (range over k: "
        f"{min(sds):.3f}-{max(sds):.3f})",
        value,
        None,
        None,
        verdict,
        source,
        note,
        f"sd {NOISY_VALUE_SD}: a tenth of a value's whole range",
    )


def prm_skill(info: Mapping[str, Any]) -> tuple[float, str]:
    """The local PRM's Brier skill on its validation problems (1 - Brier / the constant's; ``nan`` when
    its ``prm.json`` has no validation metrics) and a line that says what it rests on."""
    metrics = info.get("metrics") or {}
    brier, constant = metrics.get("val_plain/brier"), metrics.get("val_plain/brier_constant")
    if brier is None or constant is None or not constant > 0:
        return math.nan, "no validation metrics"
    skill = 1.0 - float(brier) / float(constant)
    auc = float(metrics.get("val_plain/auc", math.nan))
    steps = int(metrics.get("val_plain/n_steps", 0))
    return skill, (
        f"Brier skill {skill:.3f} (Brier {float(brier):.4f} against the constant's {float(constant):.4f}, "
        f"AUC {auc:.2f}, {steps} steps of held-out problems)"
    )


def prm_claim(prm: pl.DataFrame, source: str, prm_model: Mapping[str, Any] | None = None) -> Claim:
    """The PRM's step scores follow the thought NLL change more than the answer NLL change.

    ``prm_model``: the local PRM's ``prm.json`` (its validation metrics). A PRM whose Brier skill is
    below ``PRM_MIN_SKILL`` has not learned step values, so what its scores follow says nothing of the
    claim: the verdict is inconclusive whatever the correlations."""
    statement = "The PRM's step scores follow the thought NLL more than the answer NLL"
    base = prm.filter((pl.col("prm") == "prm_score") & (~pl.col("given_answer")))
    rows = {r["nll"]: r for r in base.to_dicts()}
    thought, answer = rows.get("d_thought_nll"), rows.get("d_answer_nll")
    if (
        thought is None
        or answer is None
        or not all(math.isfinite(float(r["spearman"])) for r in (thought, answer))
    ):
        return Claim(
            "prm_follows_thought_nll",
            statement,
            "|Spearman|",
            None,
            None,
            None,
            "inconclusive",
            source,
            "too few scored segments",
        )
    t, a = abs(float(thought["spearman"])), abs(float(answer["spearman"]))
    t_low, t_high = abs_interval(*correlation_interval(thought))
    a_low, a_high = abs_interval(*correlation_interval(answer))
    diff = t - a
    # The two half-widths combined as if the correlations were independent: conservative, since both
    # are read on the same segments and move together between resamples.
    half = math.hypot(max(t - t_low, t_high - t), max(a - a_low, a_high - a))
    low, high = (diff - half, diff + half) if math.isfinite(half) else (math.nan, math.nan)
    measure = (
        f"|Spearman(PRM score, Δ thought NLL)| - |Spearman(PRM score, Δ answer NLL)|; thought "
        f"{t:.3f} [{t_low:.3f}, {t_high:.3f}], answer {a:.3f} [{a_low:.3f}, {a_high:.3f}] "
        f"(n = {int(thought['n'])}, {int(thought.get('clusters') or 0)} problems; 95% intervals by a "
        "bootstrap over problems)"
    )
    verdict = verdict_by_size(low, high, CORRELATION_DIFFERENCE_THRESHOLD)
    note = (
        "the difference's interval combines the two correlations' half-widths as if independent "
        "(conservative: they are read on the same segments)"
    )
    if prm_model is not None:
        skill, line = prm_skill(prm_model)
        measure += f"; the PRM's validation: {line}"
        if not skill >= PRM_MIN_SKILL:
            scores_verdict, verdict = verdict, "inconclusive"
            note = (
                f"the PRM has not learned step values (Brier skill {skill:.3f} < {PRM_MIN_SKILL:.2f}): "
                f"its scores alone would be judged {scores_verdict}, but what they follow says nothing "
                "of what a PRM follows; " + note
            )
    return Claim(
        "prm_follows_thought_nll",
        statement,
        measure,
        diff,
        low,
        high,
        verdict,
        source,
        note,
        f"±{CORRELATION_DIFFERENCE_THRESHOLD} in |ρ|: a sixth of a moderate correlation; a PRM with a "
        f"Brier skill of at least {PRM_MIN_SKILL:.2f} on held-out problems",
    )


def cost_claim(cost: pl.DataFrame, rredcot: str | None, mc: str | None, source: str) -> Claim:
    """Where RREDCoT's step cost, as a ratio to GRPO's, falls against the paper's range: within it,
    cheaper or dearer; MC's against RREDCoT's in the note ("much more": at least MUCH_LARGER x)."""
    lo, hi = RREDCOT_COST_RANGE
    statement = f"RREDCoT costs {lo}-{hi}x GRPO per step, Monte Carlo credit much more"

    def row(label: str | None) -> dict[str, Any]:
        if label is None:
            return {}
        rows = cost.filter((pl.col("item") == label) & (pl.col("kind") == "train")).to_dicts()
        return rows[0] if rows else {}

    r, m = _finite(row(rredcot).get("step_ratio_to_grpo")), _finite(row(mc).get("step_ratio_to_grpo"))
    mc_generated = _finite(row(mc).get("rollout_tokens_per_step"))
    threshold = f"the paper's range, {lo}-{hi}x"
    if r is None:
        return Claim(
            "cost",
            statement,
            "step time ratio to GRPO",
            None,
            None,
            None,
            "inconclusive",
            source,
            "RREDCoT arm not run",
            threshold,
        )
    verdict = "within the paper's range" if lo <= r <= hi else "cheaper" if r < lo else "dearer"
    if m is None or not mc_generated:
        note = "no MC arm in this run" if m is None else "the MC arm generated no rollouts"
    else:
        much = "much more" if m >= MUCH_LARGER * r else "not much more"
        note = f"MC: {m:.2f}x GRPO, {m / r:.1f}x RREDCoT ({much}: the line is {MUCH_LARGER}x RREDCoT)"
    within = _finite(row(rredcot).get("step_ratio_within_run"))
    if within is not None:
        note += f"; RREDCoT's step against its own step without the credit: {within:.2f}x"
    return Claim(
        "cost",
        statement,
        "RREDCoT step time / GRPO step time (mean over seeds)",
        r,
        None,
        None,
        verdict,
        source,
        note,
        threshold,
    )


def localisation_claim(summary: Mapping[str, Any], source: str) -> Claim:
    """Testbed: RREDCoT's most-blamed segment is the culprit of wrong traces that go wrong in thinking."""
    statement = (
        f"Testbed: RREDCoT's most-blamed segment is a wrong trace's thinking culprit in at least "
        f"{LOCALISATION_TARGET:.0%} of such traces"
    )
    part = summary.get("thinking", {})
    n = int(part.get("traces", 0))
    if n == 0:
        return Claim(
            "testbed_localisation",
            statement,
            "top-blame rate",
            None,
            None,
            None,
            "inconclusive",
            source,
            "no wrong trace with a thinking culprit",
        )
    rate = float(part["top_blame_rate"])
    low, high = wilson_interval(rate, n)
    return Claim(
        "testbed_localisation",
        statement,
        f"share of {n} thinking-culprit traces whose most-blamed segment is the culprit "
        f"(chance {float(part.get('chance', math.nan)):.2f})",
        rate,
        low,
        high,
        verdict_above(low, high, LOCALISATION_TARGET),
        source,
        "Wilson interval",
        f"the testbed's target, {LOCALISATION_TARGET:.0%} (chance is about a quarter)",
    )


def claims_table(
    cfg: Mapping[str, Any],
    paired: pl.DataFrame,
    cost: pl.DataFrame,
    truncation: pl.DataFrame,
    attribution: pl.DataFrame,
    prm: pl.DataFrame,
    variance: pl.DataFrame,
    localisation: Mapping[str, Any] | None,
    sources: Mapping[str, str],
    compute: pl.DataFrame | None = None,
    prm_model: Mapping[str, Any] | None = None,
) -> list[Claim]:
    """Every claim, in the paper's order, then the testbed's checks. ``prm_model``: the local PRM's
    ``prm.json``, which ``prm_claim`` reads (None for a hub PRM)."""
    arms = active_arms(cfg)
    reference = arm_label(cfg, arms[0])

    def label_of(credit: str) -> str | None:
        found = [
            a for a in arms if cfg["arms"][a]["credit"] == credit and cfg["arms"][a]["loss_type"] == "grpo"
        ]
        return arm_label(cfg, found[0]) if found else None

    rredcot, mc, oracle = label_of("rredcot"), label_of("mc"), label_of("oracle")
    exact = label_of("exact")
    steps = int(cfg["rl"]["max_steps"])
    claims = [
        accuracy_claim(
            paired,
            rredcot or "RREDCoT",
            reference,
            "rredcot_beats_grpo",
            f"RREDCoT reaches a higher final accuracy than {reference}",
            sources["paired"],
        ),
        efficiency_claim(paired, rredcot or "RREDCoT", reference, steps, sources["paired"]),
        tracks_mc_claim(attribution, sources["attribution"]),
        truncation_claim(truncation, sources["truncation"]),
        noise_claim(variance, int(cfg["credit"]["mc"]["samples"]), sources["variance"]),
        prm_claim(prm, sources["prm"], prm_model),
        cost_claim(cost, rredcot, mc, sources["cost"]),
        accuracy_claim(
            paired if exact else paired.clear(),
            exact or "Exact values",
            reference,
            "testbed_exact_beats_grpo",
            f"Testbed: exact values (the ceiling of credit) beat {reference}, so the testbed can judge "
            "credit",
            sources["paired"],
        ),
        accuracy_claim(
            paired,
            oracle or "Oracle",
            reference,
            "testbed_oracle_beats_grpo",
            f"Testbed finding: perfect blame (oracle, the ceiling of blame only) beats {reference}",
            sources["paired"],
        ),
    ]
    if mc is not None:
        compute_source = sources.get("compute", "compute.csv")
        claims[1:1] = [
            accuracy_claim(
                paired,
                mc,
                reference,
                "mc_beats_grpo",
                f"Monte Carlo credit reaches a higher final accuracy than {reference}",
                sources["paired"],
            ),
        ]
        claims[3:3] = [
            efficiency_claim(paired, mc, reference, steps, sources["paired"], claim="mc_sample_efficiency"),
            accuracy_claim(
                paired,
                rredcot or "RREDCoT",
                mc,
                "rredcot_matches_mc",
                f"RREDCoT's credit is as good as Monte Carlo's: its final accuracy is not behind {mc}'s",
                sources["paired"],
                not_below=True,
            ),
            efficiency_claim(
                paired,
                rredcot or "RREDCoT",
                mc,
                steps,
                sources["paired"],
                claim="rredcot_matches_mc_over_the_run",
                not_below=True,
            ),
            equal_compute_claim(compute, rredcot or "RREDCoT", mc, compute_source),
        ]
    if localisation is not None:
        claims.append(localisation_claim(localisation, sources["localisation"]))
    return claims


def _count(x: int | None, missing: str) -> str:
    return missing if x is None else str(x)


def _fmt(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if math.isinf(x):
        return "inf"
    return f"{x:.3f}"


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
        low, high = _finite(row["diff_low"]), _finite(row["diff_high"])
        half = None if low is None or high is None else (high - low) / 2
        se = None if half is None else half / Z95
        between, within = _finite(row.get("seed_sd")), _finite(row.get("problem_sd"))
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
                seeds_to_decide(_finite(row["diff"]), half, int(row["seeds"])),
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

    pair = attribution.filter(
        ((pl.col("method_a") == "rredcot") & (pl.col("method_b") == "mc"))
        | ((pl.col("method_a") == "mc") & (pl.col("method_b") == "rredcot"))
    ).sort("fraction")
    pair = pair.filter(pl.col("spearman").is_not_nan() & (pl.col("n") >= 4))
    if not pair.is_empty():
        for r in (pair.row(0, named=True), pair.row(-1, named=True)):
            rho = float(r["spearman"])
            where = f"last {r['fraction']:.0%} of the thinking" if r["fraction"] < 1 else "all segments"
            what = f"Spearman(RREDCoT, MC), {where}"
            out.append(row("rredcot_tracks_mc", what, r, rho, correlation_interval(r), correlation_n(rho)))
    base = (
        prm.filter((pl.col("prm") == "prm_score") & (~pl.col("given_answer"))) if not prm.is_empty() else prm
    )
    found = {r["nll"]: r for r in base.to_dicts()} if not base.is_empty() else {}
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


def markdown(
    claims: Sequence[Claim],
    experiment: str,
    power: Sequence[Power] = (),
    correlations: Sequence[CorrelationPower] = (),
) -> str:
    lines = [
        f"# Claims of the paper, checked on this testbed ({experiment})",
        "",
        "Verdicts, judged by size: **supported** (the 95% interval lies beyond the claim's threshold on "
        "its side), **contradicted** (beyond it on the other side), **too small to matter** (inside "
        "±threshold: whatever the effect, it is smaller than what matters), **inconclusive** (the run "
        "cannot tell); the cost claim says where the ratio falls against the paper's range. A verdict "
        "holds for this testbed and these settings only. Rows named `testbed_*` check the testbed "
        "itself. `testbed_exact_beats_grpo` decides whether it can judge credit assignment: exact values "
        "credit right traces and blame wrong ones from what the task knows, with no sampling noise, so "
        "where they do not beat GRPO the testbed cannot show that credit helps. Perfect blame "
        "(`testbed_oracle_beats_grpo`) moves only a wrong trace's blame and is reported as a finding.",
        "",
    ]
    if power:
        powered = all(p.powered for p in power)
        worst = max((p.half_width for p in power if p.half_width is not None), default=math.nan)
        lines += [
            f"**Power: {'powered' if powered else 'underpowered'}.** "
            + (
                f"Every final-accuracy interval is within ±{POWER_HALF_WIDTH} (widest ±{worst:.3f}): a "
                f"+0.02 difference is resolved."
                if powered
                else f"The widest final-accuracy interval is ±{worst:.3f}, more than the ±{POWER_HALF_WIDTH} "
                f"that resolves a +0.02 difference: verdicts on effects of that size are luck here "
                f"(config/testbed.yaml is the powered recipe)."
            ),
            "",
        ]
    lines += [
        "| claim | verdict | value | 95% interval | threshold | measured | source |",
        "|---|---|---|---|---|---|---|",
    ]

    def cell(text: str) -> str:  # a literal '|' (absolute values) would end the table cell
        return text.replace("|", "\\|")

    for c in claims:
        interval = "-" if c.low is None or c.high is None else f"[{_fmt(c.low)}, {_fmt(c.high)}]"
        lines.append(
            f"| {cell(c.statement)} | **{c.verdict}** | {_fmt(c.value)} | {interval} | {cell(c.threshold)} "
            f"| {cell(c.measure)} | `{c.source}` |"
        )
    notes = [f"- `{c.claim}`: {c.note}" for c in claims if c.note]
    if notes:
        lines += ["", "Notes:", "", *notes]
    if power:
        lines += [
            "",
            "## Power of the accuracy comparisons",
            "",
            "Final sampled accuracy of each arm minus the reference's, paired by seed and problem. "
            "Spread over seeds and over problems within a seed; the minimum detectable effect is the "
            "smallest true difference this run finds above 0 (above the threshold) with 80% power at "
            f"the 5% level; then the seeds a ±{POWER_HALF_WIDTH} interval needs, and the seeds at which "
            "the difference, if it stayed as measured, would get a verdict by size (beyond the "
            "threshold, or inside it: too small to matter).",
            "",
            "| arm | seeds x problems | sd over seeds | sd over problems | 95% half-width | "
            "detectable effect | detectable by size | seeds for ±0.01 | seeds to decide |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for p in power:
            lines.append(
                f"| {p.arm} | {p.seeds} x {p.problems} | {_fmt(p.seed_sd)} | {_fmt(p.problem_sd)} | "
                f"±{_fmt(p.half_width)} | {_fmt(p.detectable)} | {_fmt(p.detectable_by_size)} | "
                f"{p.seeds_needed if p.seeds_needed is not None else '-'} | "
                f"{p.seeds_to_decide if p.seeds_to_decide is not None else '-'} |"
            )
    if correlations:
        lines += [
            "",
            "## Power of the correlations",
            "",
            "Each correlation behind a claim: its pairs and the problems they come from, the half-width "
            "of its 95% interval (bootstrap over problems), and its design effect (the squared ratio of that "
            "half-width to the Fisher interval's, which counts the pairs as independent). Independent pairs "
            f"needed: for a ±{CORRELATION_HALF_WIDTH} interval (for the PRM claim, or for the difference of "
            "its two correlations to get a verdict by size if they stayed as measured, whichever is more). "
            "Drawing more traces of the "
            "same problems adds pairs that are worth less as the problems repeat, and at most problems / icc "
            "independent ones (icc: the correlation of pairs within a problem, from the design effect): "
            "'pairs needed' and 'traces needed' (`studies.n_traces`; for the PRM claim "
            "`studies.prm.analysis_problems` when set) say what gives it on this run's "
            "problems ('out of reach' where nothing does); 'problems needed', how many problems at this "
            "run's traces per problem give it.",
            "",
            "| claim | correlation | ρ | pairs | problems | 95% half-width | design effect | icc | "
            "independent pairs needed | pairs needed | traces needed | problems needed |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for c in correlations:
            reach = "out of reach" if c.n_independent is not None and c.n_needed is None else "-"
            lines.append(
                f"| `{c.claim}` | {cell(c.what)} | {_fmt(c.rho)} | {c.n} | {c.problems or '-'} | "
                f"±{_fmt(c.half_width)} | {_fmt(c.design_effect)} | {_fmt(c.icc)} | "
                f"{_count(c.n_independent, '-')} | {_count(c.n_needed, reach)} | "
                f"{_count(c.traces_needed, reach)} | {_count(c.problems_needed, '-')} |"
            )
    lines += [
        "",
        f"Lines of our own: an accuracy difference matters from {ACCURACY_THRESHOLD} on, a rank "
        f"correlation from {CORRELATION_THRESHOLD} and a difference of two from "
        f"{CORRELATION_DIFFERENCE_THRESHOLD}, truncation from {TRUNCATION_THRESHOLD:.0%} of the "
        f"rollouts; a local PRM has learned step values from a Brier skill of {PRM_MIN_SKILL:.2f} on "
        f"held-out problems; a value is noisy above a bootstrap sd of {NOISY_VALUE_SD}; MC costs much "
        f"more than RREDCoT at {MUCH_LARGER}x its step ratio; the paper puts RREDCoT at "
        f"{RREDCOT_COST_RANGE[0]}-{RREDCOT_COST_RANGE[1]}x GRPO.",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    from rredcot.infra.tracking import stage_run

    ap = argparse.ArgumentParser(
        prog="rredcot claims", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--config", nargs="+", required=True)
    ap.add_argument("--paired", required=True, type=Path, help="rredcot report --paired output")
    ap.add_argument("--cost", required=True, type=Path, help="rredcot tables --cost output")
    ap.add_argument("--truncation", required=True, type=Path, help="Figure 3's CSV")
    ap.add_argument("--attribution", required=True, type=Path, help="Figure 4's CSV")
    ap.add_argument("--prm", required=True, type=Path, help="Figure 5's CSV")
    ap.add_argument("--variance", required=True, type=Path, help="Figure 7's CSV")
    ap.add_argument("--localisation", type=Path, help="rredcot study-localisation summary (synthetic task)")
    ap.add_argument(
        "--compute", type=Path, help="rredcot report --compute output (accuracy at equal compute)"
    )
    ap.add_argument(
        "--prm-model", type=Path, help="the local PRM's directory (rredcot study-prm-train): its prm.json"
    )
    ap.add_argument("--csv", required=True, type=Path)
    ap.add_argument("--md", required=True, type=Path)
    args = ap.parse_args(argv)
    cfg = stage_config(args.config, "claims")
    files = (
        "paired",
        "cost",
        "truncation",
        "attribution",
        "prm",
        "variance",
        "localisation",
        "compute",
        "prm_model",
    )
    sources = {k: Path(getattr(args, k)).name if getattr(args, k) else "" for k in files}
    with stage_run(cfg, "claims", rule="claims", params={k: str(getattr(args, k)) for k in files}) as run:
        claims = claims_table(
            cfg,
            pl.read_csv(args.paired),
            pl.read_csv(args.cost),
            pl.read_csv(args.truncation),
            pl.read_csv(args.attribution),
            pl.read_csv(args.prm),
            pl.read_csv(args.variance),
            json.loads(args.localisation.read_text()) if args.localisation else None,
            sources,
            pl.read_csv(args.compute) if args.compute else None,
            json.loads((args.prm_model / "prm.json").read_text()) if args.prm_model else None,
        )
        frame = pl.DataFrame([asdict(c) for c in claims], infer_schema_length=None)
        with atomic_path(args.csv) as tmp:
            frame.write_csv(tmp)
        power = power_table(pl.read_csv(args.paired))
        correlations = correlation_power(
            pl.read_csv(args.attribution),
            pl.read_csv(args.prm),
            int(cfg["studies"]["n_traces"]),
            int(cfg["studies"]["prm"]["analysis_problems"]) or None,
        )
        with atomic_path(args.md) as tmp:
            Path(tmp).write_text(markdown(claims, cfg["experiment"], power, correlations))
        counts = {
            v: sum(c.verdict == v for c in claims)
            for v in ("supported", "contradicted", "too small to matter", "inconclusive")
        }
        values = {
            f"claim/{c.claim}": c.value for c in claims if c.value is not None and math.isfinite(c.value)
        }
        detectable = {f"power/{p.arm}/detectable_effect": p.detectable for p in power if p.detectable}
        run.log_metrics(
            {f"claims_{k.replace(' ', '_')}": float(v) for k, v in counts.items()} | values | detectable
        )
        run.log_artifact(args.csv)
        run.log_artifact(args.md)
        for c in claims:
            _log.info(f"{c.verdict:>12}  {c.claim}: {_fmt(c.value)} [{_fmt(c.low)}, {_fmt(c.high)}]")


if __name__ == "__main__":
    setup_logging()
    main()
