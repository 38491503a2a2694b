"""Which claims a run checks, in the paper's order, then the field's public methods, then the testbed's
checks: the arms the config runs pick the rows (the Monte Carlo comparisons only with an ``mc`` arm,
those of a public method only with its arm, the localisation and credit-fidelity checks only with their
summaries), and each row is judged by its builder in ``rredcot.studies.claims``. ``arm_claims`` says
which rows concern each arm (the methods table, ``rredcot.studies.methods_table``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import polars as pl

from rredcot.settings.config import active_arms, arm_label
from rredcot.studies.claims import (
    Claim,
    accuracy_claim,
    cost_claim,
    efficiency_claim,
    equal_compute_claim,
    fidelity_claim,
    localisation_claim,
    noise_claim,
    paired_row,
    prm_claim,
    tracks_mc_claim,
    truncation_claim,
)

PUBLIC_METHODS = ("spo", "prime")
"""The field's public credit methods RREDCoT is held against: SPO-chain (``spo``, arXiv 2505.23564) and
PRIME (``prime``, arXiv 2502.01456). An arm that trains one under the GRPO loss gets four rows: it
against the reference (final accuracy, ``{credit}_beats_grpo``, and over the run,
``{credit}_sample_efficiency``), and RREDCoT against it at equal steps (``rredcot_beats_{credit}``)
and at equal training compute (``rredcot_vs_{credit}_at_equal_compute``, non-inferiority); the last
two read the rows of ``paired.csv`` and ``compute.csv`` that the pair ``[rredcot, {credit}]`` of
``report.pairs`` makes."""


def grpo_arm(cfg: Mapping[str, Any], credit: str) -> str | None:
    """The first arm the run trains with ``credit`` under the GRPO loss (the arm the claims about that
    credit read), or None."""
    spec = cfg["arms"]
    return next(
        (a for a in active_arms(cfg) if spec[a]["credit"] == credit and spec[a]["loss_type"] == "grpo"),
        None,
    )


@dataclass(frozen=True)
class ArmClaims:
    """The claims that concern one arm: it against the reference (the run's first arm), and RREDCoT
    against it at equal steps and at equal training compute (None where the run checks no such
    claim)."""

    vs_reference: str
    rredcot_at_equal_steps: str | None = None
    rredcot_at_equal_compute: str | None = None


def arm_claims(cfg: Mapping[str, Any]) -> dict[str, ArmClaims]:
    """By arm, the rows of ``claims_table`` that concern it: RREDCoT's, Monte Carlo's, the testbed's
    exact values and oracle, and each public method's (``PUBLIC_METHODS``). The reference itself and
    arms of other credits or losses have none."""
    against = {
        "rredcot": ArmClaims("rredcot_beats_grpo"),
        "mc": ArmClaims("mc_beats_grpo", "rredcot_matches_mc", "rredcot_matches_mc_at_equal_compute"),
        "exact": ArmClaims("testbed_exact_beats_grpo"),
        "oracle": ArmClaims("testbed_oracle_beats_grpo"),
    } | {
        c: ArmClaims(f"{c}_beats_grpo", f"rredcot_beats_{c}", f"rredcot_vs_{c}_at_equal_compute")
        for c in PUBLIC_METHODS
    }
    reference = active_arms(cfg)[0]
    found = {grpo_arm(cfg, credit): names for credit, names in against.items()}
    return {arm: names for arm, names in found.items() if arm is not None and arm != reference}


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
    fidelity: Mapping[str, Any] | None = None,
) -> list[Claim]:
    """Every claim, in the paper's order, then the testbed's checks. ``prm_model``: the local PRM's
    ``prm.json``, which ``prm_claim`` reads (None for a hub PRM); ``fidelity``: the credit-fidelity
    study's JSON (synthetic task)."""
    arms = active_arms(cfg)
    reference = arm_label(cfg, arms[0])

    def label_of(credit: str) -> str | None:
        found = grpo_arm(cfg, credit)
        return arm_label(cfg, found) if found else None

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
    # The field's public methods after the paper's claims, before the testbed's checks.
    first_check = next((i for i, c in enumerate(claims) if c.claim.startswith("testbed_")), len(claims))
    claims[first_check:first_check] = [
        row
        for credit in PUBLIC_METHODS
        for row in public_method_claims(cfg, credit, paired, compute, reference, sources)
    ]
    if localisation is not None:
        claims.append(localisation_claim(localisation, sources["localisation"]))
    if fidelity is not None:
        claims.append(fidelity_claim(fidelity, sources.get("fidelity", "fidelity.json")))
    return claims


def public_method_claims(
    cfg: Mapping[str, Any],
    credit: str,
    paired: pl.DataFrame,
    compute: pl.DataFrame | None,
    reference: str,
    sources: Mapping[str, str],
) -> list[Claim]:
    """The rows of a public method (``PUBLIC_METHODS``): none when the run does not train it, else it
    against the reference, and RREDCoT against it at equal steps and at equal compute."""
    arm = grpo_arm(cfg, credit)
    if arm is None:
        return []
    label, rredcot_arm = arm_label(cfg, arm), grpo_arm(cfg, "rredcot")
    rredcot = arm_label(cfg, rredcot_arm) if rredcot_arm else "RREDCoT"
    unpaired = rredcot_arm is not None and paired_row(paired, rredcot, "sampled", label) is None
    note = f"the run compares the two when report.pairs holds [{rredcot_arm}, {arm}]" if unpaired else ""
    return [
        accuracy_claim(
            paired,
            label,
            reference,
            f"{credit}_beats_grpo",
            f"{label} reaches a higher final accuracy than {reference}",
            sources["paired"],
        ),
        efficiency_claim(
            paired,
            label,
            reference,
            int(cfg["rl"]["max_steps"]),
            sources["paired"],
            claim=f"{credit}_sample_efficiency",
        ),
        accuracy_claim(
            paired,
            rredcot,
            label,
            f"rredcot_beats_{credit}",
            f"RREDCoT reaches a higher final accuracy than {label} at equal steps",
            sources["paired"],
            note=note,
        ),
        equal_compute_claim(
            compute,
            rredcot,
            label,
            sources.get("compute", "compute.csv"),
            claim=f"rredcot_vs_{credit}_at_equal_compute",
            note=note,
        ),
    ]
