"""The paper's other tables: the Nano-style comparison (``table2.csv``) and the cost of each credit method.

``table2``: one row per benchmark, columns base / GRPO-trained / RREDCoT-trained (mean and sd over
seeds of the configured metric), then the paper's reference values (``report.reference``) in
separately labelled ``paper_*`` columns, so measured and quoted numbers never mix.

``cost``: one row per arm with what its training cost on this machine: wall and CPU seconds per
training job (Snakemake's ``benchmark:`` files), the median training-step time and the credit time
per step (the trainer's metrics), and the step time relative to the uniform-credit GRPO arm; then
what the models a credit method keeps beside the policy cost (PRIME's implicit PRM, a trainable copy
of the policy with its optimizer: ``EXTRA_MODELS``): ``extra_memory_gib``, the most memory they held
at any step (weights, gradients, optimizer moments), and ``extra_model_s_per_step``, their seconds per
step (part of the step's, taken as ``credit_s_per_step`` is: the median over a seed's steps after the
first, averaged over seeds); empty for an arm whose credit keeps none. Rows for
the studies (Monte Carlo values, attributions, PRM) and the scoring benchmark (``rredcot bench``:
forward pass, σ single-pass, σ naive, Monte Carlo at the same exit points) follow when present.

CLI: ``rredcot tables --config C --summaries S.json ... --table2 table2.csv --cost cost.csv
[--benchmarks-dir results/benchmarks] [--train-dir results/train] [--bench results/bench/credit.json]``.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from rredcot.infra.io import atomic_path
from rredcot.infra.logs import setup_logging
from rredcot.infra.results import BASE, load_summaries
from rredcot.method.registry import credit_method
from rredcot.settings.config import active_arms, arm_label
from rredcot.settings.reads import stage_config

_log = logging.getLogger(__name__)


def nano_table(
    cfg: Mapping[str, Any], summaries: Sequence[str | Path], metric: str, grpo: str, rredcot: str
) -> pl.DataFrame:
    """Base vs GRPO-trained vs RREDCoT-trained per benchmark, then the paper's quoted values."""
    long = load_summaries(summaries).filter(pl.col("metric") == metric)
    stats = long.group_by(["benchmark", "arm"]).agg(
        pl.col("value").mean().round(4).alias("mean"),
        pl.col("value").std(ddof=1).fill_null(0.0).round(4).alias("sd"),
        pl.col("seed").n_unique().alias("seeds"),
    )
    out = stats.select("benchmark").unique()
    for arm, name in ((BASE, "base"), (grpo, "grpo"), (rredcot, "rredcot")):
        part = stats.filter(pl.col("arm") == arm).select(
            "benchmark",
            pl.col("mean").alias(f"{name}_mean"),
            pl.col("sd").alias(f"{name}_sd"),
            pl.col("seeds").alias(f"{name}_seeds"),
        )
        out = out.join(part, on="benchmark", how="left")
    # Quoted values join on the benchmark name; benchmarks measured here but not in the paper (or the
    # reverse) keep their row with empty cells on the other side.
    reference = cfg["report"]["reference"]
    if reference:
        columns = sorted({c for values in reference.values() for c in values})
        quoted = pl.DataFrame(
            [{"benchmark": b, **{f"paper_{c}": v.get(c) for c in columns}} for b, v in reference.items()],
            schema={"benchmark": pl.String, **{f"paper_{c}": pl.Float64 for c in columns}},
        )
        out = out.join(quoted, on="benchmark", how="full", coalesce=True)
    labels = f"{metric}; grpo = {arm_label(cfg, grpo)}, rredcot = {arm_label(cfg, rredcot)}"
    out = out.with_columns(pl.lit(labels).alias("measured"))
    return out.sort([pl.col("benchmark") == "all", "benchmark"])


def _tsv_rows(path: Path) -> list[dict[str, str]]:
    with open(path) as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


def _step_times(train_dir: Path, arm: str) -> tuple[list[float], list[float], list[float]]:
    """Per seed of an arm: the median step seconds, credit seconds, and step / (step - credit).

    The last is a paired estimate of the credit's overhead from the arm's own steps: the step
    against the same step without the credit computation. Arms drift apart after their first update
    and share the machine with whatever jobs run beside them, which the cross-arm ratio cannot see.
    The first step warms up and is skipped.
    """
    steps, credit, paired = [], [], []
    for metrics in sorted(train_dir.glob(f"{arm}/seed*/metrics.jsonl")):
        rows = []
        with open(metrics) as fh:
            rows = [row for row in map(json.loads, fh) if "step_time" in row]
        if not rows:
            continue
        t = [float(r["step_time"]) for r in rows]
        c = [float(r.get("credit/seconds", 0.0)) for r in rows]
        steps.append(statistics.median(t[1:] or t))
        credit.append(statistics.median(c[1:] or c))
        ratios = [a / (a - b) for a, b in zip(t, c, strict=True) if a > b]
        paired.append(statistics.median(ratios[1:] or ratios) if ratios else 1.0)
    return steps, credit, paired


EXTRA_MODELS = ("prime",)
"""Prefixes of the trainer's metrics (``<prefix>/memory_gib``, ``<prefix>/seconds``) of the models a
credit method keeps and trains beside the policy: PRIME's implicit PRM (``prime``)."""


def _extra_models(train_dir: Path, arm: str) -> tuple[float | None, float | None]:
    """The most GiB the arm's extra models held at any step of any seed, and their seconds per step
    (per seed the median over steps after the first, then the mean over seeds); None where no step
    logs them."""
    memory, seconds = [], []
    for metrics in sorted(train_dir.glob(f"{arm}/seed*/metrics.jsonl")):
        with open(metrics) as fh:
            rows = list(map(json.loads, fh))
        memory += [
            sum(float(r[f"{p}/memory_gib"]) for p in EXTRA_MODELS if f"{p}/memory_gib" in r)
            for r in rows
            if any(f"{p}/memory_gib" in r for p in EXTRA_MODELS)
        ]
        own = [
            sum(float(r[f"{p}/seconds"]) for p in EXTRA_MODELS if f"{p}/seconds" in r)
            for r in rows
            if any(f"{p}/seconds" in r for p in EXTRA_MODELS)
        ]
        if own:
            seconds.append(statistics.median(own[1:] or own))
    return (max(memory) if memory else None), (statistics.mean(seconds) if seconds else None)


def _rollout_tokens(
    train_dir: Path, arm: str, completions_per_step: int
) -> tuple[float | None, float | None]:
    """Mean tokens per step of the Monte Carlo arm's rollouts and of the policy's own completions.

    Generation is what Monte Carlo credit buys its values with; the two side by side say how many
    times the GRPO step's own sampling it generates."""
    rollouts, own = [], []
    for metrics in sorted(train_dir.glob(f"{arm}/seed*/metrics.jsonl")):
        with open(metrics) as fh:
            rows = [row for row in map(json.loads, fh) if "step_time" in row]
        rollouts += [float(r["credit/rollout_tokens"]) for r in rows if "credit/rollout_tokens" in r]
        own += [
            float(r["completions/mean_length"]) * completions_per_step
            for r in rows
            if "completions/mean_length" in r
        ]
    return (statistics.mean(rollouts) if rollouts else None), (statistics.mean(own) if own else None)


def cost_table(
    cfg: Mapping[str, Any], benchmarks_dir: Path, train_dir: Path, bench: Path | None
) -> pl.DataFrame:
    """Cost per credit method (training) and per study; seconds on this machine."""
    rows: list[dict[str, Any]] = []
    arms = active_arms(cfg)
    base_step = None
    for arm in arms:
        jobs = [r for p in sorted(benchmarks_dir.glob(f"train/{arm}/seed*.tsv")) for r in _tsv_rows(p)]
        steps, credit, paired = _step_times(train_dir, arm)
        step = statistics.mean(steps) if steps else None
        if arm_of_uniform_grpo(cfg, arm) and step is not None and base_step is None:
            base_step = step
        per_step = cfg["rl"]["prompts_per_step"] * cfg["rl"]["num_generations"]
        rollout_tokens, completion_tokens = _rollout_tokens(train_dir, arm, per_step)
        extra_memory, extra_seconds = _extra_models(train_dir, arm)
        rows.append(
            {
                "item": arm_label(cfg, arm),
                "kind": "train",
                "credit": cfg["arms"][arm]["credit"],
                "loss_type": cfg["arms"][arm]["loss_type"],
                "jobs": len(jobs),
                "wall_s_per_job": _mean(float(r["s"]) for r in jobs),
                "cpu_s_per_job": _mean(float(r["cpu_time"]) for r in jobs),
                "step_s": step,
                "credit_s_per_step": statistics.mean(credit) if credit else None,
                "step_ratio_within_run": round(statistics.mean(paired), 3) if paired else None,
                "completion_tokens_per_step": completion_tokens,
                "rollout_tokens_per_step": rollout_tokens,
                "step_ratio_to_grpo": None,  # below, once GRPO's step is known
                "extra_memory_gib": extra_memory,
                "extra_model_s_per_step": extra_seconds,
            }
        )
    for row in rows:
        row["step_ratio_to_grpo"] = (
            round(row["step_s"] / base_step, 3) if base_step and row["step_s"] is not None else None
        )
    for path in sorted(benchmarks_dir.glob("studies/*.tsv")):
        jobs = _tsv_rows(path)
        rows.append(
            {
                "item": path.stem,
                "kind": "study",
                "jobs": len(jobs),
                "wall_s_per_job": _mean(float(r["s"]) for r in jobs),
                "cpu_s_per_job": _mean(float(r["cpu_time"]) for r in jobs),
            }
        )
    if bench is not None and bench.is_file():
        report = json.loads(bench.read_text())
        seconds = report.get("seconds", {})
        forward = seconds.get("forward")
        for name, value in seconds.items():
            rows.append(
                {
                    "item": f"bench: {name}",
                    "kind": "scoring",
                    "wall_s_per_job": value,
                    "step_ratio_to_grpo": None,
                    "ratio_to_forward": round(value / forward, 3) if forward else None,
                }
            )
    frame = pl.DataFrame(rows, infer_schema_length=None)
    return frame.with_columns(pl.col(pl.Float64).round(3))


def arm_of_uniform_grpo(cfg: Mapping[str, Any], arm: str) -> bool:
    """The reference arm of the cost ratios: uniform credit under the sequence-mean loss, every token
    in the loss (stock GRPO; the first such arm of the run when there are several)."""
    spec = cfg["arms"][arm]
    return (
        credit_method(spec["credit"]).uniform
        and spec["loss_type"] == "grpo"
        and spec["top_entropy_quantile"] == 1.0
    )


def _mean(values: Any) -> float | None:
    values = list(values)
    return round(statistics.mean(values), 2) if values else None


def main(argv: Sequence[str] | None = None) -> None:
    from rredcot.infra.tracking import stage_run

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", nargs="+", required=True)
    ap.add_argument("--summaries", nargs="+", required=True, help="evaluation summaries (JSON)")
    ap.add_argument("--table2", required=True, help="output: Nano-style comparison (CSV)")
    ap.add_argument("--cost", required=True, help="output: cost per credit method and study (CSV)")
    ap.add_argument("--benchmarks-dir", type=Path, default=Path("results/benchmarks"))
    ap.add_argument("--train-dir", type=Path, default=Path("results/train"))
    ap.add_argument("--bench", type=Path, help="rredcot bench report (JSON), if one was run")
    args = ap.parse_args(argv)
    cfg = stage_config(args.config, "tables")
    rep = cfg["report"]
    with stage_run(cfg, "tables", rule="tables", params={"report": json.dumps(rep)}) as run:
        metric = rep["table2_metric"] or f"avg@{cfg['eval']['n_samples']}"
        grpo, rredcot = rep["table2_arms"]
        table2 = nano_table(cfg, args.summaries, metric, grpo, rredcot)
        cost = cost_table(cfg, args.benchmarks_dir, args.train_dir, args.bench)
        for frame, path in ((table2, args.table2), (cost, args.cost)):
            with atomic_path(path) as tmp:
                frame.write_csv(tmp)
            run.log_artifact(path)
        with pl.Config(tbl_rows=60, tbl_cols=20, tbl_width_chars=220):
            _log.info("\n%s\n%s", table2, cost)


if __name__ == "__main__":
    setup_logging()
    main()
