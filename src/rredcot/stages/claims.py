"""The paper's claims, each checked against what this run measured: ``claims.csv`` and ``claims.md``.

    rredcot claims --config C --paired paired.csv --cost cost.csv --truncation fig3_truncation.csv \\
        --attribution fig4_attribution_correlation.csv --prm fig5_prm_vs_nll.csv --compute compute.csv \\
        --variance fig7_mc_variance.csv [--localisation localisation.json] [--prm-model PRM_DIR] \\
        [--fidelity fidelity.json] --csv claims.csv --md claims.md [--methods methods.csv]

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
it; RREDCoT's most-blamed segment should be a wrong trace's culprit; RREDCoT's credit should rank
segments like the exact values more than Monte Carlo credit at the budget nearest its cost does
(``study-fidelity``). With a Monte Carlo arm, RREDCoT is
also held against it at equal steps and at equal training compute (``compute.csv``), as
non-inferiority: not behind by more than the threshold. A section on the power of the correlations gives
the study size (``studies.n_traces``) a ±0.1 interval needs. ``--methods`` (and ``claims.md``'s
"Methods side by side") puts the methods the run trains side by side: accuracy against the reference,
fidelity to the exact values, cost per step and the verdicts of each one's claims
(``rredcot.studies.methods_table``).

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
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import polars as pl

from rredcot.infra.io import atomic_path
from rredcot.infra.logs import setup_logging
from rredcot.settings.reads import stage_config
from rredcot.studies.claims import fmt
from rredcot.studies.claims_markdown import markdown
from rredcot.studies.claims_table import claims_table
from rredcot.studies.methods_table import methods_table
from rredcot.studies.power import correlation_power, power_table

_log = logging.getLogger(__name__)


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
    ap.add_argument(
        "--fidelity",
        type=Path,
        help="rredcot study-fidelity summary (synthetic task): credit against exact values",
    )
    ap.add_argument("--csv", required=True, type=Path)
    ap.add_argument("--md", required=True, type=Path)
    ap.add_argument("--methods", type=Path, help="output: the methods side by side (CSV)")
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
        "fidelity",
    )
    sources = {k: Path(getattr(args, k)).name if getattr(args, k) else "" for k in files}
    with stage_run(cfg, "claims", rule="claims", params={k: str(getattr(args, k)) for k in files}) as run:
        paired, cost = pl.read_csv(args.paired), pl.read_csv(args.cost)
        fidelity = json.loads(args.fidelity.read_text()) if args.fidelity else None
        claims = claims_table(
            cfg,
            paired,
            cost,
            pl.read_csv(args.truncation),
            pl.read_csv(args.attribution),
            pl.read_csv(args.prm),
            pl.read_csv(args.variance),
            json.loads(args.localisation.read_text()) if args.localisation else None,
            sources,
            pl.read_csv(args.compute) if args.compute else None,
            json.loads((args.prm_model / "prm.json").read_text()) if args.prm_model else None,
            fidelity,
        )
        frame = pl.DataFrame([asdict(c) for c in claims], infer_schema_length=None)
        with atomic_path(args.csv) as tmp:
            frame.write_csv(tmp)
        methods = methods_table(cfg, claims, paired, cost, fidelity)
        if args.methods:
            with atomic_path(args.methods) as tmp:
                pl.DataFrame([asdict(m) for m in methods], infer_schema_length=None).write_csv(tmp)
            run.log_artifact(args.methods)
        power = power_table(paired)
        correlations = correlation_power(
            pl.read_csv(args.attribution),
            pl.read_csv(args.prm),
            int(cfg["studies"]["n_traces"]),
            int(cfg["studies"]["prm"]["analysis_problems"]) or None,
        )
        with atomic_path(args.md) as tmp:
            Path(tmp).write_text(markdown(claims, cfg["experiment"], power, correlations, methods))
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
            _log.info(f"{c.verdict:>12}  {c.claim}: {fmt(c.value)} [{fmt(c.low)}, {fmt(c.high)}]")


if __name__ == "__main__":
    setup_logging()
    main()
