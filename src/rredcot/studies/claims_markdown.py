"""``claims.md``: the claims as a table with their verdicts and notes, the methods side by side, the
power of the accuracy comparisons and of the correlations, and the lines of our own that the verdicts
rest on."""

from __future__ import annotations

import math
from collections.abc import Sequence

from rredcot.studies.claims import (
    ACCURACY_THRESHOLD,
    CORRELATION_DIFFERENCE_THRESHOLD,
    CORRELATION_THRESHOLD,
    MUCH_LARGER,
    NOISY_VALUE_SD,
    PRM_MIN_SKILL,
    RREDCOT_COST_RANGE,
    TRUNCATION_THRESHOLD,
    Claim,
    fmt,
)
from rredcot.studies.methods_table import MethodRow
from rredcot.studies.power import CORRELATION_HALF_WIDTH, POWER_HALF_WIDTH, CorrelationPower, Power


def _count(x: int | None, missing: str) -> str:
    return missing if x is None else str(x)


def _with_interval(value: float | None, low: float | None, high: float | None) -> str:
    """A value with its 95% interval in brackets, ``-`` without the value."""
    if value is None:
        return "-"
    return fmt(value) if low is None or high is None else f"{fmt(value)} [{fmt(low)}, {fmt(high)}]"


def _verdict(claim: str | None, verdict: str | None) -> str:
    return "-" if claim is None else f"{verdict or 'not checked'} (`{claim}`)"


def _power_banner(power: Sequence[Power]) -> str:
    """The line heading the claims: whether every final-accuracy interval is within ±POWER_HALF_WIDTH,
    and where one is not, which comparisons are wide and whether their verdicts are decided anyway (a
    difference far enough from the threshold needs no narrower interval: ``Power.seeds_to_decide``)."""
    if all(p.powered for p in power):
        worst = max((p.half_width for p in power if p.half_width is not None), default=math.nan)
        return (
            f"**Power: powered.** Every final-accuracy interval is within ±{POWER_HALF_WIDTH} (widest "
            f"±{worst:.3f}): a +0.02 difference is resolved."
        )
    wide = [p for p in power if not p.powered]
    narrow = [p.half_width for p in power if p.powered and p.half_width is not None]
    named = ", ".join(
        f"{p.arm} (±{p.half_width:.3f})" if p.half_width is not None else f"{p.arm} (no interval)"
        for p in wide
    )
    line = (
        f"**Power: underpowered** for {named}: wider than the ±{POWER_HALF_WIDTH} that resolves a +0.02 "
        "difference, so a verdict on an effect of that size is luck there (config/testbed.yaml is the "
        "powered recipe)."
    )
    if narrow:
        line += f" Every other interval is within ±{POWER_HALF_WIDTH} (widest ±{max(narrow):.3f})."
    decided = [p.arm for p in wide if p.seeds_to_decide is not None and p.seeds_to_decide <= p.seeds]
    if decided:
        line += (
            f" Decided at their width all the same (their difference lies far enough from the threshold; "
            f'"seeds to decide" below): {", ".join(decided)}.'
        )
    return line


def methods_section(methods: Sequence[MethodRow]) -> list[str]:
    """The lines of "Methods side by side": ``methods.csv`` as a table (``rredcot.studies.methods_table``)."""
    reference = methods[0].reference
    lines = [
        "",
        "## Methods side by side",
        "",
        f"Each method the run trains (`methods.csv`): final sampled accuracy and mean lead over the run "
        f"(the area between the learning curves) against {reference}, paired by seed and problem "
        "(`paired.csv`); fidelity, the Spearman ρ of its credit with the exact value change within a "
        "trace (`fidelity.json`, synthetic task; Monte Carlo at the budget it trains with); cost per "
        "step, its step time over GRPO's, its credit seconds and the memory of the models its credit "
        f"keeps beside the policy (`cost.csv`); and the verdicts of the claims about it, against "
        f"{reference} and RREDCoT's against it at equal steps and at equal training compute (the rows "
        "above, named). 95% intervals in brackets; `-`: not measured for this method.",
        "",
        f"| method | final accuracy − {reference} | area − {reference} | ρ with the exact values | "
        "step / GRPO | credit s / step | extra memory (GiB) | against "
        f"{reference} | RREDCoT against it, equal steps | RREDCoT against it, equal compute |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m in methods:
        fidelity = _with_interval(m.rho_trace, m.rho_trace_low, m.rho_trace_high)
        if m.fidelity_key is not None and m.fidelity_key != m.credit:
            fidelity += f" (`{m.fidelity_key}`)"
        lines.append(
            f"| {m.label} | {_with_interval(m.diff, m.diff_low, m.diff_high)} | "
            f"{_with_interval(m.area, m.area_low, m.area_high)} | {fidelity} | "
            f"{fmt(m.step_ratio_to_grpo)} | {fmt(m.credit_s_per_step)} | {fmt(m.extra_memory_gib)} | "
            f"{_verdict(m.claim_vs_reference, m.verdict_vs_reference)} | "
            f"{_verdict(m.claim_rredcot_at_equal_steps, m.verdict_rredcot_at_equal_steps)} | "
            f"{_verdict(m.claim_rredcot_at_equal_compute, m.verdict_rredcot_at_equal_compute)} |"
        )
    return lines


def markdown(
    claims: Sequence[Claim],
    experiment: str,
    power: Sequence[Power] = (),
    correlations: Sequence[CorrelationPower] = (),
    methods: Sequence[MethodRow] = (),
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
        "(`testbed_oracle_beats_grpo`) moves only a wrong trace's blame and is reported as a finding. "
        "`testbed_rredcot_fidelity_beats_mc` holds RREDCoT's segment credit and Monte Carlo's against the "
        "exact values, Monte Carlo at the budget nearest RREDCoT's cost.",
        "",
    ]
    if power:
        lines += [_power_banner(power), ""]
    lines += [
        "| claim | verdict | value | 95% interval | threshold | measured | source |",
        "|---|---|---|---|---|---|---|",
    ]

    def cell(text: str) -> str:  # a literal '|' (absolute values) would end the table cell
        return text.replace("|", "\\|")

    for c in claims:
        interval = "-" if c.low is None or c.high is None else f"[{fmt(c.low)}, {fmt(c.high)}]"
        lines.append(
            f"| {cell(c.statement)} | **{c.verdict}** | {fmt(c.value)} | {interval} | {cell(c.threshold)} "
            f"| {cell(c.measure)} | `{c.source}` |"
        )
    notes = [f"- `{c.claim}`: {c.note}" for c in claims if c.note]
    if notes:
        lines += ["", "Notes:", "", *notes]
    if methods:
        lines += methods_section(methods)
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
                f"| {p.arm} | {p.seeds} x {p.problems} | {fmt(p.seed_sd)} | {fmt(p.problem_sd)} | "
                f"±{fmt(p.half_width)} | {fmt(p.detectable)} | {fmt(p.detectable_by_size)} | "
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
                f"| `{c.claim}` | {cell(c.what)} | {fmt(c.rho)} | {c.n} | {c.problems or '-'} | "
                f"±{fmt(c.half_width)} | {fmt(c.design_effect)} | {fmt(c.icc)} | "
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
