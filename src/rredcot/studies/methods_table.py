"""The methods side by side (``methods.csv``, and a section of ``claims.md``): one row per arm the run
trains, in run order, with what each source says of it.

- accuracy: its final sampled accuracy minus the reference's (the run's first arm), and its mean lead
  over the run (the area between the learning curves), each with its 95% paired bootstrap interval
  (``paired.csv``; none for the reference itself);
- fidelity: the Spearman ρ of its credit with the exact value change within a trace, with its 95%
  interval from a bootstrap over problems (``fidelity.json``, synthetic task): the study's row of the
  arm's credit method, at the Monte Carlo budget the arm trains with (``credit.mc.samples`` and the
  arm's ``credit_options``) for a method that reads one; none where the study has no such row (a
  method it skipped, or a budget it did not score);
- cost: its step time over GRPO's, its credit seconds per step and the memory of the models its credit
  keeps beside the policy (``cost.csv``);
- verdicts: of the claims that concern it (``rredcot.studies.claims_table.arm_claims``): it against the
  reference, and RREDCoT against it at equal steps and at equal training compute, each with the
  claim's name, since the rows differ in kind (Monte Carlo's are non-inferiority, a public method's
  by size).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl

from rredcot.settings.config import active_arms, arm_label
from rredcot.studies.claims import Claim, finite, paired_row
from rredcot.studies.claims_table import arm_claims


@dataclass
class MethodRow:
    """One row of ``methods.csv``: an arm and its numbers against the reference, the exact values and
    GRPO's cost, and the verdicts of its claims (None where a source has nothing for it)."""

    arm: str
    label: str
    credit: str
    reference: str
    diff: float | None
    diff_low: float | None
    diff_high: float | None
    area: float | None
    area_low: float | None
    area_high: float | None
    fidelity_key: str | None
    rho_trace: float | None
    rho_trace_low: float | None
    rho_trace_high: float | None
    step_ratio_to_grpo: float | None
    credit_s_per_step: float | None
    extra_memory_gib: float | None
    claim_vs_reference: str | None
    verdict_vs_reference: str | None
    claim_rredcot_at_equal_steps: str | None
    verdict_rredcot_at_equal_steps: str | None
    claim_rredcot_at_equal_compute: str | None
    verdict_rredcot_at_equal_compute: str | None


def fidelity_row(
    cfg: Mapping[str, Any], arm: str, fidelity: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """The fidelity study's row of the arm's credit method, at the Monte Carlo budget the arm trains
    with when the method reads one (its rows are one per budget); None without one."""
    if fidelity is None:
        return None
    spec = cfg["arms"][arm]
    rows = [r for r in fidelity.get("rows", []) if r.get("method") == spec["credit"]]
    if any(r.get("samples") is not None for r in rows):
        options = (spec.get("credit_options") or {}).get("mc") or {}
        budget = int(options.get("samples", cfg["credit"]["mc"]["samples"]))
        rows = [r for r in rows if r.get("samples") == budget]
    return rows[0] if rows else None


def methods_table(
    cfg: Mapping[str, Any],
    claims: Sequence[Claim],
    paired: pl.DataFrame,
    cost: pl.DataFrame,
    fidelity: Mapping[str, Any] | None = None,
) -> list[MethodRow]:
    """One row per arm the run trains, in run order (module docstring): ``claims`` as
    ``rredcot.studies.claims_table.claims_table`` returns them, ``paired.csv``, ``cost.csv`` and the
    fidelity study's JSON (None off the synthetic task)."""
    arms = active_arms(cfg)
    reference = arm_label(cfg, arms[0])
    verdicts = {c.claim: c.verdict for c in claims}
    names = arm_claims(cfg)
    costs = {r["item"]: r for r in cost.filter(pl.col("kind") == "train").to_dicts()}
    rows = []
    for arm in arms:
        label = arm_label(cfg, arm)
        accuracy = (paired_row(paired, label, "sampled", reference) if arm != arms[0] else None) or {}
        scored = fidelity_row(cfg, arm, fidelity) or {}
        spent = costs.get(label, {})
        claim = names.get(arm)
        steps = claim.rredcot_at_equal_steps if claim else None
        compute = claim.rredcot_at_equal_compute if claim else None
        rows.append(
            MethodRow(
                arm,
                label,
                cfg["arms"][arm]["credit"],
                reference,
                *(finite(accuracy.get(k)) for k in ("diff", "diff_low", "diff_high")),
                *(finite(accuracy.get(k)) for k in ("area", "area_low", "area_high")),
                scored.get("key"),
                *(finite(scored.get(k)) for k in ("rho_trace", "rho_trace_low", "rho_trace_high")),
                *(finite(spent.get(k)) for k in ("step_ratio_to_grpo", "credit_s_per_step")),
                finite(spent.get("extra_memory_gib")),
                claim.vs_reference if claim else None,
                verdicts.get(claim.vs_reference) if claim else None,
                steps,
                verdicts.get(steps) if steps else None,
                compute,
                verdicts.get(compute) if compute else None,
            )
        )
    return rows
