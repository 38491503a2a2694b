"""Which claims a run checks, in the paper's order, then the testbed's checks: the arms the config
runs pick the rows (the Monte Carlo comparisons only with an ``mc`` arm, the localisation and
credit-fidelity checks only with their summaries), and each row is judged by its builder in
``rredcot.studies.claims``."""

from __future__ import annotations

from collections.abc import Mapping
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
    prm_claim,
    tracks_mc_claim,
    truncation_claim,
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
    fidelity: Mapping[str, Any] | None = None,
) -> list[Claim]:
    """Every claim, in the paper's order, then the testbed's checks. ``prm_model``: the local PRM's
    ``prm.json``, which ``prm_claim`` reads (None for a hub PRM); ``fidelity``: the credit-fidelity
    study's JSON (synthetic task)."""
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
    if fidelity is not None:
        claims.append(fidelity_claim(fidelity, sources.get("fidelity", "fidelity.json")))
    return claims
