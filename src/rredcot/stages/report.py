"""Tables and figures from evaluation summaries and learning curves.

``table1``: rows = benchmark x metric, columns = base (SFT) and every arm, each as mean and standard
deviation over seeds plus the number of seeds (the paper's Table 1 shape, with spread).
``paired``: every arm against the run's first arm (GRPO in the default), and the pairs of
``report.pairs`` (RREDCoT against Monte Carlo credit in the default), paired by seed and problem:
final accuracy differences and the steps to reach the reference's final accuracy, with bootstrap
intervals (``rredcot.infra.stats``).
``compute``: the same pairs against training seconds (each job's step times): the cost of each arm,
its accuracy at equal compute, and the share of the reference's cost at which it reaches the
reference's final accuracy.
``curve``: held-out accuracy (greedy and sampled panels) vs RL step, one line per arm, seeds as a
band (95% bootstrap interval of the mean over seeds), and a third panel with each arm's sampled
accuracy minus the first arm's, paired by seed and step (the band: the same interval over the
per-seed differences, which leave out what the arms of one seed share).

CLI: ``rredcot report --config C --summaries S1.json ... --curves c1.csv ... --table table1.csv
[--paired paired.csv] [--metrics m1.jsonl ... --compute compute.csv] --figure learning_curve.png``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from rredcot.infra.io import atomic_path, read_jsonl
from rredcot.infra.logs import setup_logging
from rredcot.infra.results import BASE, load_summaries
from rredcot.infra.stats import (
    STALL_FACTOR,
    Interval,
    cost_shares,
    cumulative_seconds,
    equal_compute_difference,
    paired_area,
    paired_difference,
    reach_share,
    seed_sd,
    steps_to_reach_reference,
    without_stalls,
)
from rredcot.settings.config import active_arms, arm_label
from rredcot.settings.reads import stage_config

_log = logging.getLogger(__name__)


def comparison_table(long: pl.DataFrame, arms: Sequence[str], labels: Mapping[str, str]) -> pl.DataFrame:
    """Wide table: one row per benchmark and metric; mean, sd and seed count per arm."""
    stats = long.group_by(["benchmark", "metric", "arm"]).agg(
        pl.col("value").mean().alias("mean"),
        pl.col("value").std(ddof=1).fill_null(0.0).alias("sd"),
        pl.col("seed").n_unique().alias("n_seeds"),
    )
    out = stats.select("benchmark", "metric").unique()
    for arm in [BASE, *arms]:
        name = labels.get(arm, arm)
        part = stats.filter(pl.col("arm") == arm).select(
            "benchmark",
            "metric",
            pl.col("mean").round(4).alias(f"{name}_mean"),
            pl.col("sd").round(4).alias(f"{name}_sd"),
            pl.col("n_seeds").alias(f"{name}_seeds"),
        )
        out = out.join(part, on=["benchmark", "metric"], how="left")
    # "all" last, levels in natural order; greedy before sampled metrics.
    return out.sort([pl.col("benchmark") == "all", "benchmark", "metric"])


def write_table(cfg: Mapping[str, Any], summaries: Sequence[str], out: str | Path) -> pl.DataFrame:
    arms = active_arms(cfg)
    labels = {BASE: "base_sft", **{a: arm_label(cfg, a).lower().replace(" ", "_") for a in arms}}
    table = comparison_table(load_summaries(summaries), arms, labels)
    with atomic_path(out) as tmp:
        table.write_csv(tmp)
    return table


def _records_of(summary: str | Path) -> Path:
    """The per-problem records an evaluation wrote beside its summary."""
    return Path(str(summary).removesuffix(".summary.json") + ".records.jsonl")


def _scores(summaries: Sequence[str]) -> dict[tuple[str, int], dict[str, dict[str, float]]]:
    """Per (arm, seed): per metric (greedy, sampled), each problem's score by id."""
    out: dict[tuple[str, int], dict[str, dict[str, float]]] = {}
    for summary in summaries:
        meta = json.loads(Path(summary).read_text())
        greedy, sampled = {}, {}
        for row in read_jsonl(_records_of(summary)):
            greedy[row["id"]] = float(row["greedy_correct"])
            samples = row.get("sample_correct") or []
            if samples:
                sampled[row["id"]] = sum(map(float, samples)) / len(samples)
        out[(meta["arm"], int(meta["seed"]))] = {"greedy": greedy, "sampled": sampled}
    return out


def _matrix(
    scores: dict[tuple[str, int], dict[str, dict[str, float]]],
    arm: str,
    seeds: list[int],
    metric: str,
    ids: list[str],
) -> np.ndarray:
    """[seeds, problems] scores of one arm."""
    return np.array([[scores[(arm, s)][metric][i] for i in ids] for s in seeds])


def _curves(curve: pl.DataFrame, arm: str, seeds: list[int], steps: list[int], metric: str) -> np.ndarray:
    """[seeds, steps] held-out accuracies of one arm's learning curves."""
    by = {
        (int(r["seed"]), int(r["step"])): float(r[metric])
        for r in curve.filter(pl.col("arm") == arm).iter_rows(named=True)
    }
    return np.array([[by.get((s, t), math.nan) for t in steps] for s in seeds])


def comparisons(cfg: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The (arm, reference) pairs of paired.csv and compute.csv: every arm against the run's first
    arm, then each pair of ``report.pairs`` whose two arms the run trains (one it does not is skipped,
    and the log says so), none twice."""
    arms = active_arms(cfg)
    pairs = [(arm, arms[0]) for arm in arms[1:]]
    for arm, reference in cfg["report"]["pairs"]:
        absent = [a for a in (arm, reference) if a not in arms]
        if absent:
            _log.info(
                "report.pairs: %s against %s skipped, the run does not train %s (run arms: %s)",
                arm,
                reference,
                " or ".join(absent),
                ", ".join(arms),
            )
        elif (arm, reference) not in pairs:
            pairs.append((arm, reference))
    return pairs


def paired_rows(
    cfg: Mapping[str, Any],
    arm: str,
    reference: str,
    scores: Mapping[tuple[str, int], dict[str, dict[str, float]]],
    curve: pl.DataFrame | None,
) -> list[dict[str, Any]]:
    """The rows of ``arm`` against ``reference`` (one per metric), over the seeds both have and the
    problems every one of their evaluations scored; see :func:`paired_table`."""
    n_boot, seed = cfg["studies"]["bootstrap"], cfg["studies"]["seed"]
    seeds = sorted(s for a, s in scores if a == arm and (reference, s) in scores)
    rows = []
    for metric in ("greedy", "sampled"):
        runs = [scores[(x, s)][metric] for s in seeds for x in (arm, reference)]
        ids = sorted(set.intersection(*map(set, runs))) if runs else []
        if not ids:
            continue
        arm_scores = _matrix(scores, arm, seeds, metric, ids)
        reference_scores = _matrix(scores, reference, seeds, metric, ids)
        diff = paired_difference(arm_scores, reference_scores, n_boot, seed)
        spread = seed_sd(arm_scores, reference_scores)
        reach = area = Interval(math.nan, math.nan, math.nan)
        if curve is not None:
            steps = sorted(
                set(curve.filter(pl.col("arm") == arm)["step"])
                & set(curve.filter(pl.col("arm") == reference)["step"])
            )
            if steps:
                arm_curves = _curves(curve, arm, seeds, steps, metric)
                reference_curves = _curves(curve, reference, seeds, steps, metric)
                reach = steps_to_reach_reference(steps, arm_curves, reference_curves, n_boot, seed)
                if len(steps) > 1:
                    area = paired_area(steps, arm_curves, reference_curves, n_boot, seed)
        rows.append(
            {
                "arm": arm_label(cfg, arm),
                "reference": arm_label(cfg, reference),
                "metric": metric,
                "seeds": len(seeds),
                "problems": len(ids),
                "diff": round(diff.estimate, 4),
                "diff_low": round(diff.low, 4),
                "diff_high": round(diff.high, 4),
                "steps_to_reference": reach.estimate,
                "steps_low": reach.low,
                "steps_high": reach.high,
                "area": round(area.estimate, 4),
                "area_low": round(area.low, 4),
                "area_high": round(area.high, 4),
                "seed_sd": round(spread[0], 4),
                "problem_sd": round(spread[1], 4),
            }
        )
    return rows


def paired_table(cfg: Mapping[str, Any], summaries: Sequence[str], curves: Sequence[str]) -> pl.DataFrame:
    """Each arm against the first arm of the run (GRPO in the default), then the pairs of
    ``report.pairs`` (:func:`comparisons`), paired by seed and problem.

    Per metric: the final held-out accuracy difference with a two-level bootstrap interval (seeds,
    then problems) and its spread (``seed_sd``: over seeds of each seed's mean difference;
    ``problem_sd``: over problems within a seed); the RL steps the arm's mean learning curve needs to
    reach the reference's final accuracy, and the area between the curves per step (``area``: the
    arm's mean lead over the run), each with a bootstrap interval over seeds (inf: not reached)."""
    scores = _scores(summaries)
    curve = pl.concat([pl.read_csv(c) for c in curves]) if curves else None
    rows = [
        row for arm, reference in comparisons(cfg) for row in paired_rows(cfg, arm, reference, scores, curve)
    ]
    schema = {
        "arm": pl.String,
        "reference": pl.String,
        "metric": pl.String,
        "seeds": pl.Int64,
        "problems": pl.Int64,
        **dict.fromkeys(
            (
                "diff",
                "diff_low",
                "diff_high",
                "steps_to_reference",
                "steps_low",
                "steps_high",
                "area",
                "area_low",
                "area_high",
                "seed_sd",
                "problem_sd",
            ),
            pl.Float64,
        ),
    }
    return pl.DataFrame(rows, schema=schema)


def _step_times(metrics: Sequence[str | Path]) -> dict[tuple[str, int], dict[int, float]]:
    """Per (arm, seed): each optimizer step's seconds, from the training job's ``metrics.jsonl``
    (``<train dir>/<arm>/seed<k>/metrics.jsonl``; rows without ``step_time`` are other logs), a
    stalled step counted at the run's median (:func:`rredcot.infra.stats.without_stalls`, with a
    warning)."""
    out: dict[tuple[str, int], dict[int, float]] = {}
    for path in map(Path, metrics):
        seed = path.parent.name.removeprefix("seed")
        if not seed.isdigit():
            raise ValueError(f"{path}: expected <arm>/seed<k>/metrics.jsonl")
        raw = {int(row["step"]): float(row["step_time"]) for row in read_jsonl(path) if "step_time" in row}
        times, stalled = without_stalls(raw)
        if stalled:
            _log.warning(
                "%s: step(s) %s took %s s, over %g times the run's median step: a stall (a suspended or "
                "starved job), counted at the median, %.2f s",
                path,
                stalled,
                ", ".join(f"{raw[k]:.1f}" for k in stalled),
                STALL_FACTOR,
                times[stalled[0]],
            )
        out[(path.parent.parent.name, int(seed))] = times
    return out


def _timed_curves(
    curve: pl.DataFrame, times: Mapping[tuple[str, int], dict[int, float]], arm: str, seeds: list[int]
) -> tuple[np.ndarray, np.ndarray]:
    """[seeds, probes] cumulative training seconds and sampled accuracies of one arm, at the probe
    steps every one of ``seeds`` has."""
    rows = curve.filter(
        pl.col("arm") == arm, pl.col("seed").is_in(seeds), pl.col("sampled").cast(pl.Float64).is_not_nan()
    )
    steps = sorted(set.intersection(*(set(rows.filter(pl.col("seed") == s)["step"]) for s in seeds)))
    seconds = np.array([cumulative_seconds(times[(arm, s)], steps) for s in seeds])
    return seconds, _curves(rows, arm, seeds, steps, "sampled")


def compute_table(
    cfg: Mapping[str, Any], curves: Sequence[str], metrics: Sequence[str | Path]
) -> pl.DataFrame:
    """Accuracy against training compute, for the pairs of paired.csv (:func:`comparisons`), over the
    seeds both arms have a learning curve and step times for.

    Each seed's sampled learning curve is put on its training seconds (probe step s at the sum of
    the times of steps 1..s, :func:`rredcot.infra.stats.cumulative_seconds`; a stalled step counts as
    the run's median step, :func:`rredcot.infra.stats.without_stalls`). ``arm_seconds`` and
    ``reference_seconds``: the mean total seconds of each arm's runs; ``cost_share``: the mean over
    seeds of their ratio; ``equal_compute_diff``: the arm's accuracy minus the reference's at the
    compute both spent (:func:`~rredcot.infra.stats.equal_compute_difference`); ``reach_share``: the
    share of the reference's seconds at which the arm's mean curve reaches the reference's final
    accuracy (:func:`~rredcot.infra.stats.reach_share`; inf: not reached). Intervals: bootstrap over
    seeds (``studies.bootstrap``, ``studies.seed``)."""
    n_boot, seed = cfg["studies"]["bootstrap"], cfg["studies"]["seed"]
    curve = pl.concat([pl.read_csv(c) for c in curves])
    times = _step_times(metrics)
    runs = {(a, int(s)) for a, s in curve.select("arm", "seed").unique().iter_rows()} & set(times)
    rows = []
    for arm, reference in comparisons(cfg):
        seeds = sorted(s for a, s in runs if a == arm and (reference, s) in runs)
        if not seeds:
            _log.info(
                "compute: %s against %s skipped, no seed has curves and step times of both", arm, reference
            )
            continue
        arm_seconds, arm_curves = _timed_curves(curve, times, arm, seeds)
        reference_seconds, reference_curves = _timed_curves(curve, times, reference, seeds)
        if any(x.shape[1] == 0 or not (x[:, -1] > 0).all() for x in (arm_seconds, reference_seconds)):
            _log.info("compute: %s against %s skipped, no probe after training steps", arm, reference)
            continue
        mean_arm, mean_reference, share = cost_shares(arm_seconds, reference_seconds)
        timed = (arm_seconds, arm_curves, reference_seconds, reference_curves, n_boot, seed)
        equal, reach = equal_compute_difference(*timed), reach_share(*timed)
        rows.append(
            {
                "arm": arm_label(cfg, arm),
                "reference": arm_label(cfg, reference),
                "seeds": len(seeds),
                "arm_seconds": round(mean_arm, 2),
                "reference_seconds": round(mean_reference, 2),
                "cost_share": round(share, 4),
                "equal_compute_diff": round(equal.estimate, 4),
                "equal_compute_low": round(equal.low, 4),
                "equal_compute_high": round(equal.high, 4),
                "reach_share": round(reach.estimate, 4),
                "reach_low": round(reach.low, 4),
                "reach_high": round(reach.high, 4),
            }
        )
    schema = {
        "arm": pl.String,
        "reference": pl.String,
        "seeds": pl.Int64,
        **dict.fromkeys(
            (
                "arm_seconds",
                "reference_seconds",
                "cost_share",
                "equal_compute_diff",
                "equal_compute_low",
                "equal_compute_high",
                "reach_share",
                "reach_low",
                "reach_high",
            ),
            pl.Float64,
        ),
    }
    return pl.DataFrame(rows, schema=schema)


def paired_curves(curve: pl.DataFrame, reference: str) -> pl.DataFrame:
    """Each other arm's learning curve minus ``reference``'s of the same seed and step (columns
    arm, seed, step, greedy, sampled); a (seed, step) the reference lacks is left out."""
    ref = curve.filter(pl.col("arm") == reference).select(
        "seed", "step", pl.col("greedy").alias("_greedy"), pl.col("sampled").alias("_sampled")
    )
    return (
        curve.filter(pl.col("arm") != reference)
        .join(ref, on=["seed", "step"], how="inner")
        .select(
            "arm",
            "seed",
            "step",
            (pl.col("greedy") - pl.col("_greedy")).alias("greedy"),
            (pl.col("sampled") - pl.col("_sampled")).alias("sampled"),
        )
        .sort("arm", "seed", "step")
    )


def plot_curves(cfg: Mapping[str, Any], curves: Sequence[str], out: str | Path) -> None:
    """Learning curves as PNG (and PDF beside it): accuracy per arm with a 95% bootstrap band over
    seeds, and (with two arms or more) the paired difference to the first arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    labels = {a: arm_label(cfg, a) for a in cfg["arms"]}
    raw = pl.concat([pl.read_csv(c) for c in curves])
    reference = active_arms(cfg)[0]
    method = pl.col("arm").replace_strict(labels, default=pl.col("arm")).alias("method")
    df = raw.with_columns(method)
    diff = paired_curves(raw, reference).with_columns(method).to_pandas()
    n_seeds = df["seed"].n_unique()
    long = df.unpivot(
        index=["method", "seed", "step"],
        on=["greedy", "sampled"],
        variable_name="decoding",
        value_name="accuracy",
    ).to_pandas()
    sns.set_theme(style="whitegrid", context="paper")
    present = set(long["method"])
    order = [m for m in dict.fromkeys(arm_label(cfg, a) for a in active_arms(cfg)) if m in present]
    order += sorted(present - set(order))
    # One colour per method in every panel (the difference panel has no line for the reference).
    palette = dict(zip(order, sns.color_palette(n_colors=len(order)), strict=True))
    panels = 3 if len(diff) else 2
    fig, axes = plt.subplots(1, panels, figsize=(5.25 * panels, 3.6), sharex=True)
    k, temp = cfg["eval"]["n_samples"], cfg["eval"]["temperature"]
    titles = {"greedy": "greedy decoding", "sampled": f"sampled (mean of {k} at T={temp})"}
    band = {"errorbar": ("ci", 95), "n_boot": cfg["studies"]["bootstrap"], "seed": cfg["studies"]["seed"]}
    for ax, (decoding, title) in zip(axes, titles.items(), strict=False):
        sns.lineplot(
            data=long[long["decoding"] == decoding],
            x="step",
            y="accuracy",
            hue="method",
            hue_order=order,
            palette=palette,
            marker="o",
            ax=ax,
            legend=ax is axes[0],
            **band,
        )
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("RL step")
        ax.set_ylabel("held-out accuracy")
    if panels == 3:
        ax = axes[2]
        sns.lineplot(
            data=diff,
            x="step",
            y="sampled",
            hue="method",
            hue_order=[m for m in order if m in set(diff["method"])],
            palette=palette,
            marker="o",
            ax=ax,
            legend=False,
            **band,
        )
        ax.axhline(0.0, color="0.3", linewidth=0.8, linestyle="--")
        ax.set_title(f"sampled, minus {labels.get(reference, reference)} (paired by seed)", fontsize=9)
        ax.set_xlabel("RL step")
        ax.set_ylabel("accuracy difference")
    n_probe = cfg["rl"]["eval_problems"]
    fig.suptitle(
        f"Learning curves: {n_probe} held-out problems, {n_seeds} seed{'s' * (n_seeds != 1)} per method "
        "(band: 95% bootstrap interval of the mean over seeds)",
        fontsize=10,
    )
    # One legend for both panels, outside them: with many arms an inside legend hides the curves.
    handles, names = axes[0].get_legend_handles_labels()
    axes[0].get_legend().remove()
    fig.legend(handles, names, title="method", loc="center left", bbox_to_anchor=(0.99, 0.5), frameon=False)
    fig.tight_layout()
    out = Path(out)
    for target in (out, out.with_suffix(".pdf")):
        with atomic_path(target) as tmp:
            fig.savefig(tmp, dpi=150, bbox_inches="tight")
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> None:
    from rredcot.infra.tracking import stage_run

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", nargs="+", required=True, help="config YAML file(s), later ones override")
    ap.add_argument(
        "--summaries", nargs="+", required=True, help="evaluation summaries (JSON), base and arms"
    )
    ap.add_argument("--curves", nargs="+", required=True, help="learning curves (CSV) of the trained arms")
    ap.add_argument("--table", required=True, help="output comparison table (CSV)")
    ap.add_argument(
        "--paired",
        help="output paired comparison with the first arm and report.pairs (CSV; bootstrap intervals)",
    )
    ap.add_argument(
        "--metrics",
        nargs="+",
        default=[],
        help="per-step training metrics (<arm>/seed<k>/metrics.jsonl) of the trained arms, for --compute",
    )
    ap.add_argument(
        "--compute", help="output accuracy against training compute, same pairs (CSV; needs --metrics)"
    )
    ap.add_argument(
        "--figure", required=True, help="output learning-curve figure (PNG; a PDF is written beside)"
    )
    args = ap.parse_args(argv)
    if args.compute and not args.metrics:
        ap.error("--compute needs the training metrics (--metrics)")
    cfg = stage_config(args.config, "report")
    with stage_run(cfg, "report", rule="report") as run:
        table = write_table(cfg, args.summaries, args.table)
        with pl.Config(tbl_rows=50, tbl_cols=20, tbl_width_chars=200):
            _log.info("\n%s", table)
        plot_curves(cfg, args.curves, args.figure)
        outputs = [args.table, args.figure, Path(args.figure).with_suffix(".pdf")]
        if args.paired:
            paired = paired_table(cfg, args.summaries, args.curves)
            with atomic_path(args.paired) as tmp:
                paired.write_csv(tmp)
            with pl.Config(tbl_rows=50, tbl_cols=20, tbl_width_chars=200):
                _log.info("paired with %s and report.pairs:\n%s", active_arms(cfg)[0], paired)
            outputs.append(args.paired)
        if args.compute:
            compute = compute_table(cfg, args.curves, args.metrics)
            with atomic_path(args.compute) as tmp:
                compute.write_csv(tmp)
            with pl.Config(tbl_rows=50, tbl_cols=20, tbl_width_chars=200):
                _log.info("accuracy against training compute:\n%s", compute)
            outputs.append(args.compute)
        for path in outputs:
            run.log_artifact(path)


if __name__ == "__main__":
    setup_logging()
    main()
