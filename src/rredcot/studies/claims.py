"""The paper's claims, each checked against what a run measured: the lines that say what size
matters, a ``Claim`` row, and one function per claim that reads its source table and judges it.

A claim is judged by size against its threshold (``rredcot.infra.stats``: ``verdict_by_size``, or
``verdict_not_below`` for "as good as"), against a target (``verdict_above``), or against a line
(the noise and cost claims); ``Claim.inconclusive`` is the row of a claim the run cannot judge.
``rredcot.studies.claims_table`` lists them in the paper's order; ``rredcot.studies.power`` says what
the run could resolve; ``rredcot.studies.claims_markdown`` writes them out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import polars as pl

from rredcot.infra.stats import (
    abs_interval,
    verdict_above,
    verdict_by_size,
    verdict_not_below,
    wilson_interval,
)

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
    """One row of ``claims.csv``: a claim, what was measured, and the verdict."""

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

    @classmethod
    def inconclusive(
        cls, claim: str, statement: str, measure: str, source: str, note: str, threshold: str = ""
    ) -> Claim:
        """A claim the run cannot judge: no value, no interval, and the note says why."""
        return cls(claim, statement, measure, None, None, None, "inconclusive", source, note, threshold)


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


def correlation_interval(row: Mapping[str, Any]) -> tuple[float, float]:
    """A correlation row's 95% interval, by the bootstrap over problems of the figure that wrote it."""
    if "spearman_low" not in row:
        raise ValueError(
            "the correlation table has no spearman_low/spearman_high columns (drawn before the bootstrap "
            "over problems): redraw its figures with rredcot study-attr-figures"
        )
    low, high = row["spearman_low"], row["spearman_high"]
    return (math.nan, math.nan) if low is None or high is None else (float(low), float(high))


def rredcot_mc_rows(attribution: pl.DataFrame) -> pl.DataFrame:
    """Figure 4's correlations of RREDCoT's segment rewards with Monte Carlo's that can be judged (a
    finite ρ over 4 pairs or more), by the fraction of the thinking they cover: the first row holds the
    latest segments, the last all of them."""
    pair = attribution.filter(
        ((pl.col("method_a") == "rredcot") & (pl.col("method_b") == "mc"))
        | ((pl.col("method_a") == "mc") & (pl.col("method_b") == "rredcot"))
    ).sort("fraction")
    return pair.filter(pl.col("spearman").is_not_nan() & (pl.col("n") >= 4))


def prm_score_rows(prm: pl.DataFrame) -> dict[str, dict[str, Any]]:
    """Figure 5's correlations of the PRM's score (without the given answer), by the NLL change they
    correlate it with (``d_thought_nll``, ``d_answer_nll``)."""
    base = prm.filter((pl.col("prm") == "prm_score") & (~pl.col("given_answer")))
    return {r["nll"]: r for r in base.to_dicts()}


def finite(x: Any) -> float | None:
    """``x`` as a float when it is a finite number, else None."""
    try:
        value = float(x)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def fmt(x: float | None) -> str:
    """A value as the claims show it: three decimals, ``inf``, or ``-`` when missing."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if math.isinf(x):
        return "inf"
    return f"{x:.3f}"


def paired_row(paired: pl.DataFrame, label: str, metric: str, reference: str) -> dict[str, Any] | None:
    """``paired.csv``'s row of ``label`` against ``reference`` for ``metric`` (``sampled``, ``greedy``),
    or None when the run has no such pair."""
    rows = paired.filter(
        (pl.col("arm") == label) & (pl.col("metric") == metric) & (pl.col("reference") == reference)
    ).to_dicts()
    return rows[0] if rows else None


def accuracy_verdict(low: float | None, high: float | None, not_below: bool) -> tuple[str, str]:
    """The verdict of an accuracy difference's interval against ``ACCURACY_THRESHOLD``, and its verdict
    by size: with ``not_below`` the first is non-inferiority, else the two are the same."""
    by_size = verdict_by_size(low, high, ACCURACY_THRESHOLD)
    return (verdict_not_below(low, high, ACCURACY_THRESHOLD) if not_below else by_size), by_size


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
    row = paired_row(paired, label, "sampled", reference)
    if row is None:
        return Claim.inconclusive(
            claim,
            statement,
            f"{label} - {reference}, sampled accuracy",
            source,
            f"{note}; " * bool(note) + f"no paired row for {label} against {reference} (arm not run)",
        )
    low, high = finite(row["diff_low"]), finite(row["diff_high"])
    verdict, by_size = accuracy_verdict(low, high, not_below)
    if not_below:
        note = f"{note}; judged by size: {by_size}".lstrip("; ")
    return Claim(
        claim,
        statement,
        f"{label} - {reference}, final sampled held-out accuracy (paired, {row['seeds']} seeds x "
        f"{row['problems']} problems)",
        finite(row["diff"]),
        low,
        high,
        verdict,
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
    row = paired_row(paired, label, "sampled", reference)
    measure = f"mean lead of {label} over {reference} across the run (area between the learning curves)"
    if row is None or finite(row.get("area")) is None:
        note = f"no paired row for {label}" if row is None else "no learning curves with two probes or more"
        return Claim.inconclusive(claim, statement, measure, source, note)
    low, high = finite(row["area_low"]), finite(row["area_high"])
    steps = " ".join(
        f"{float(row[k]):.0f}" if row[k] is not None and math.isfinite(float(row[k])) else "inf"
        for k in ("steps_to_reference", "steps_low", "steps_high")
    ).split()
    verdict, by_size = accuracy_verdict(low, high, not_below)
    note = "bootstrap over seeds of each seed's area; inf: not reached within the run"
    return Claim(
        claim,
        statement,
        f"{measure}, sampled probe accuracy; steps to reach {reference}'s final accuracy "
        f"{steps[0]} [{steps[1]}, {steps[2]}] of {last_step}",
        finite(row["area"]),
        low,
        high,
        verdict,
        source,
        f"{note}; judged by size: {by_size}" if not_below else note,
        f"-{ACCURACY_THRESHOLD} accuracy, as for final accuracy"
        if not_below
        else f"±{ACCURACY_THRESHOLD} accuracy, as for final accuracy",
    )


def equal_compute_claim(
    compute: pl.DataFrame | None,
    label: str,
    reference: str,
    source: str,
    claim: str = "rredcot_matches_mc_at_equal_compute",
    note: str = "",
) -> Claim:
    """At equal training compute the arm is not behind the reference (accuracy of both learning curves
    at the seconds of training the cheaper of the two spent, per seed); the share of the reference's
    training seconds the arm needs to reach the reference's final accuracy is reported beside it.
    ``note`` leads the row's note when it has no ``compute.csv`` row."""
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
        why = "no compute.csv" if compute is None else f"no {label} against {reference} (arm not run)"
        return Claim.inconclusive(claim, statement, measure, source, f"{note}; " * bool(note) + why)
    row = rows[0]
    low, high = finite(row["equal_compute_low"]), finite(row["equal_compute_high"])
    reach = [finite(row.get(k)) for k in ("reach_share", "reach_low", "reach_high")]
    shown = ["inf" if x is None else f"{x:.2f}" for x in reach]
    return Claim(
        claim,
        statement,
        f"{measure} (per seed, at the training seconds of the cheaper arm; {row['seeds']} seeds); "
        f"{label} trains in {fmt(finite(row.get('cost_share')))} of {reference}'s seconds and reaches its "
        f"final accuracy at {shown[0]} [{shown[1]}, {shown[2]}] of them",
        finite(row["equal_compute_diff"]),
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
    pair = rredcot_mc_rows(attribution)
    if pair.is_empty():
        return Claim.inconclusive(
            "rredcot_tracks_mc",
            statement,
            "Spearman(RREDCoT, MC)",
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
        return Claim.inconclusive(
            "truncated_mc_loses_rollouts", statement, "lost fraction", source, "no rollouts"
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
        return Claim.inconclusive(
            "mc_estimates_noisy", statement, "bootstrap sd of v̂", source, "no Monte Carlo records"
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
    rows = prm_score_rows(prm)
    thought, answer = rows.get("d_thought_nll"), rows.get("d_answer_nll")
    if (
        thought is None
        or answer is None
        or not all(math.isfinite(float(r["spearman"])) for r in (thought, answer))
    ):
        return Claim.inconclusive(
            "prm_follows_thought_nll", statement, "|Spearman|", source, "too few scored segments"
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

    r, m = finite(row(rredcot).get("step_ratio_to_grpo")), finite(row(mc).get("step_ratio_to_grpo"))
    mc_generated = finite(row(mc).get("rollout_tokens_per_step"))
    threshold = f"the paper's range, {lo}-{hi}x"
    if r is None:
        return Claim.inconclusive(
            "cost", statement, "step time ratio to GRPO", source, "RREDCoT arm not run", threshold
        )
    verdict = "within the paper's range" if lo <= r <= hi else "cheaper" if r < lo else "dearer"
    if m is None or not mc_generated:
        note = "no MC arm in this run" if m is None else "the MC arm generated no rollouts"
    else:
        much = "much more" if m >= MUCH_LARGER * r else "not much more"
        note = f"MC: {m:.2f}x GRPO, {m / r:.1f}x RREDCoT ({much}: the line is {MUCH_LARGER}x RREDCoT)"
    within = finite(row(rredcot).get("step_ratio_within_run"))
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
        return Claim.inconclusive(
            "testbed_localisation",
            statement,
            "top-blame rate",
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


def fidelity_claim(fidelity: Mapping[str, Any], source: str) -> Claim:
    """Testbed: RREDCoT's segment credit ranks like the exact values more than Monte Carlo credit does
    at the budget nearest its cost (``rredcot study-fidelity``): the paired bootstrap difference of
    their mean rank correlations with the exact value change within a trace, judged by size.

    Within a trace, because that is the choice a credit method makes: every method pays a trace's
    credit with the sign of its advantage, so a correlation pooled over traces mostly measures that
    shared sign (uniform credit scores well on it); the pooled difference is reported beside."""
    claim = "testbed_rredcot_fidelity_beats_mc"
    statement = "Testbed: RREDCoT's credit is closer to the exact values than Monte Carlo's at equal cost"
    measure = "Spearman ρ with the exact value change within a trace, RREDCoT - Monte Carlo"
    threshold = (
        f"±{CORRELATION_DIFFERENCE_THRESHOLD} in ρ: a difference of two correlations that matters, as for "
        "the PRM claim"
    )
    c = fidelity.get("comparison")
    if not c:
        skipped = fidelity.get("skipped") or {}
        why = "; ".join(f"{k}: {v}" for k, v in skipped.items()) or "RREDCoT or Monte Carlo not scored"
        return Claim.inconclusive(claim, statement, measure, source, why, threshold)
    low, high = finite(c["rho_trace_diff_low"]), finite(c["rho_trace_diff_high"])
    rows = {r["key"]: r for r in fidelity.get("rows", [])}
    info = rows.get(c["method"], {})
    return Claim(
        claim,
        statement,
        f"{measure} at M = {c['samples']} rollouts per exit point (the budget whose seconds per trace are "
        f"nearest RREDCoT's: {c['cost_ratio']:.2f}x them); pooled over traces "
        f"{fmt(finite(c['rho_pooled_diff']))} [{fmt(finite(c['rho_pooled_diff_low']))}, "
        f"{fmt(finite(c['rho_pooled_diff_high']))}] (RREDCoT {fmt(finite(c['rho_pooled']))}, Monte Carlo "
        f"{fmt(finite(c['reference_rho_pooled']))}); {info.get('traces', '?')} traces of "
        f"{info.get('problems', '?')} problems, paired bootstrap over problems",
        finite(c["rho_trace_diff"]),
        low,
        high,
        verdict_by_size(low, high, CORRELATION_DIFFERENCE_THRESHOLD),
        source,
        "equal cost: the Monte Carlo budget nearest RREDCoT's wall seconds of credit per trace on a log "
        f"scale, measured on {fidelity.get('device', '?')} (not an interpolation between budgets)",
        threshold,
    )
