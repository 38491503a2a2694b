"""Figures 3 and 7 from the Monte Carlo study: what truncation loses, and how noisy MC values are.

    rredcot study-mc-figures --config C --traces traces.jsonl --mc mc.jsonl --out-dir DIR \\
        [--truncations 20 40 ...] [--label NAME]

**Figure 3** (``fig3_truncation.{png,pdf,csv}``): the proportion of MC rollouts *lost* when every
continuation is cut at T generated tokens (no complete final answer within T tokens, see
:mod:`rredcot.studies.mc`), against T, one panel per benchmark (per difficulty level when the traces
come from one benchmark). The lost rollouts that were correct when continued to the full budget B
are shown apart from the rest (wrong, or no answer even at B). The dashed line (right axis) is the
compute of one exit point at that truncation: tokens generated over its M rollouts.

**Figure 7** (``fig7_mc_variance.{png,pdf,csv}``): the standard deviation of MC estimates, by
bootstrap: m of a point's M rollouts are drawn with replacement, ``studies.bootstrap`` times (seeded
by ``studies.seed``; rredcot.settings.reads, stage ``study_mc_figures``). Left: the sd
of the value estimate v̂ at one exit point, averaged over a trace's first k exit points, then over
the traces with at least k exit points. Right: the sd of the norm of the MC segment-reward vector
(v̂_{i+1} - v̂_i for i < k-1) over the first k exit points, the quantity a credit method would use.
"""

from __future__ import annotations

import argparse
import json
import logging
import textwrap
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from rredcot.infra.io import atomic_path, read_jsonl
from rredcot.infra.logs import setup_logging
from rredcot.lm.generation import sample_seed
from rredcot.settings.reads import stage_config

_log = logging.getLogger(__name__)


def read_json(path: str | Path) -> Any:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


# ----------------------------------------------------------------------------------------- Figure 3
def lost_at(rollout: Mapping[str, Any], t: int) -> bool:
    """True iff the rollout has no complete final answer within its first ``t`` generated tokens."""
    at = rollout["answer_token"]
    return at is None or at > t


def trace_groups(traces: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """trace_id -> panel: the benchmark (source) when there are several, else the difficulty level."""
    sources = {t.get("source") or t.get("benchmark") or "" for t in traces}
    levels = {t.get("level") for t in traces} - {None, ""}
    if len(sources) > 1:
        return {t["trace_id"]: str(t.get("source") or t.get("benchmark")) for t in traces}
    if len(levels) > 1:
        return {t["trace_id"]: f"level {t.get('level')}" for t in traces}
    return {t["trace_id"]: str(next(iter(sources)) or "all") for t in traces}


def default_truncations(budget: int, n: int = 24) -> list[int]:
    """``n`` evenly spaced truncation lengths up to and including the budget."""
    return sorted({max(1, round(budget * (i + 1) / n)) for i in range(n)})


def truncation_table(
    records: Sequence[Mapping[str, Any]], groups: Mapping[str, str], truncations: Sequence[int]
) -> pl.DataFrame:
    """Per group and truncation T: lost fractions and tokens generated per exit point.

    ``lost_correct``: lost at T, correct at B. ``lost_other``: lost at T and wrong or unanswered at B.
    ``tokens_per_point``: mean over exit points of the tokens their rollouts generate up to T.
    A group ``all`` covers every record.
    """
    by_group: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for rec in records:
        by_group[groups.get(rec["trace_id"], "all")].append(rec)
    if len(by_group) > 1 or "all" not in by_group:
        by_group["all"] = list(records)
    rows = []
    for group, recs in by_group.items():
        rollouts = [r for rec in recs for r in rec["rollouts"]]
        n = max(len(rollouts), 1)
        for t in truncations:
            lost = [r for r in rollouts if lost_at(r, t)]
            correct = sum(r["correct"] for r in lost)
            rows.append(
                {
                    "group": group,
                    "truncation": int(t),
                    "points": len(recs),
                    "rollouts": len(rollouts),
                    "lost": len(lost) / n,
                    "lost_correct": correct / n,
                    "lost_other": (len(lost) - correct) / n,
                    "tokens_per_point": sum(min(r["n_tokens"], t) for r in rollouts) / max(len(recs), 1),
                }
            )
    return pl.DataFrame(rows)


# ----------------------------------------------------------------------------------------- Figure 7
def bootstrap_sd(
    correct: np.ndarray, sample_sizes: Sequence[int], n_boot: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Bootstrap sds of one trace's MC estimates from its ``[exits, M]`` correctness matrix.

    Returns ``value_sd[m_i, e]`` (sd of v̂ at exit e from m resampled rollouts) and
    ``norm_sd[m_i, k-1]`` (sd of the norm of the segment-reward vector over the first k exits;
    NaN for k = 1, which has no segment).
    """
    n_exits, total = correct.shape
    value_sd = np.empty((len(sample_sizes), n_exits))
    norm_sd = np.full((len(sample_sizes), n_exits), np.nan)
    for i, m in enumerate(sample_sizes):
        idx = rng.integers(0, total, size=(n_boot, n_exits, m))
        values = np.take_along_axis(np.broadcast_to(correct, (n_boot, n_exits, total)), idx, axis=2).mean(-1)
        value_sd[i] = values.std(axis=0, ddof=1)
        if n_exits > 1:
            norms = np.sqrt(np.cumsum(np.diff(values, axis=1) ** 2, axis=1))  # [n_boot, k-1] for k = 2..E
            norm_sd[i, 1:] = norms.std(axis=0, ddof=1)
    return value_sd, norm_sd


def variance_table(records: Sequence[Mapping[str, Any]], n_boot: int, seed: int) -> pl.DataFrame:
    """Figure 7's grid: per number of samples m and number of exit points k, the mean over traces."""
    by_trace: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for rec in records:
        by_trace[rec["trace_id"]].append(rec)
    total = min(len(rec["rollouts"]) for rec in records)
    sizes = list(range(1, total + 1))
    sums: dict[tuple[int, int], list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for trace_id in sorted(by_trace):
        recs = sorted(by_trace[trace_id], key=lambda r: r["exit_index"])
        correct = np.array([[float(r["correct"]) for r in rec["rollouts"][:total]] for rec in recs])
        rng = np.random.default_rng(sample_seed(seed, "bootstrap", trace_id))
        value_sd, norm_sd = bootstrap_sd(correct, sizes, n_boot, rng)
        for i, m in enumerate(sizes):
            for k in range(1, len(recs) + 1):
                cell = sums[(m, k)]
                cell[0] += float(value_sd[i, :k].mean())
                cell[1] += float(norm_sd[i, k - 1]) if k > 1 else 0.0
                cell[2] += 1
    rows = [
        {
            "samples": m,
            "exit_points": k,
            "traces": n,
            "value_sd": v / n,
            "reward_norm_sd": r / n if k > 1 else None,
        }
        for (m, k), (v, r, n) in sorted(sums.items())
    ]
    return pl.DataFrame(rows)


# ------------------------------------------------------------------------------------------ drawing
def _save(fig: Any, out_dir: Path, stem: str) -> list[Path]:
    paths = [out_dir / f"{stem}.png", out_dir / f"{stem}.pdf"]
    for path in paths:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=150, bbox_inches="tight")
    return paths


def _csv(table: pl.DataFrame, path: Path) -> Path:
    with atomic_path(path) as tmp:
        table.write_csv(tmp)
    return path


def _caption(fig: Any, text: str, width: int) -> None:
    """The figure's caption below its panels (``width``: characters per line)."""
    fig.text(0.0, -0.01, textwrap.fill(text, width), ha="left", va="top", fontsize=7.5)


def plot_truncation(table: pl.DataFrame, info: Mapping[str, Any], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")
    groups = [g for g in table["group"].unique(maintain_order=True) if g != "all"] or ["all"]
    fig, axes = plt.subplots(1, len(groups), figsize=(3.3 * len(groups) + 0.6, 3.3), squeeze=False)
    colors = sns.color_palette("deep")
    tokens_max = float(table["tokens_per_point"].max() or 1.0)
    for ax, group in zip(axes[0], groups, strict=True):
        part = table.filter(pl.col("group") == group).sort("truncation")
        t = part["truncation"].to_numpy()
        ax.stackplot(
            t,
            part["lost_correct"].to_numpy(),
            part["lost_other"].to_numpy(),
            colors=[colors[2], colors[7]],
            alpha=0.8,
            labels=["lost, correct if continued", "lost, wrong or no answer at B"],
        )
        ax.set_ylim(0, 1)
        ax.set_xlim(t.min(), t.max())
        ax.set_xlabel("truncation length T (generated tokens)")
        ax.set_title(
            f"{group}: {info['group_traces'][group]} traces, {part['points'][0]} exit points", fontsize=9
        )
        twin = ax.twinx()
        twin.plot(t, part["tokens_per_point"].to_numpy(), "k--", lw=1.2, label="tokens per exit point")
        twin.set_ylim(0, tokens_max * 1.05)
        twin.grid(False)
        if ax is axes[0][-1]:
            twin.set_ylabel("tokens generated per exit point (up to T)")
        else:
            twin.set_yticklabels([])
    axes[0][0].set_ylabel("proportion of rollouts lost")
    handles, labels = axes[0][0].get_legend_handles_labels()
    handles.append(matplotlib.lines.Line2D([], [], color="k", ls="--", lw=1.2))
    labels.append("tokens per exit point (right axis)")
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 1.1), ncol=3, frameon=False)
    fig.tight_layout()
    _caption(
        fig,
        f"Figure 3. Monte Carlo rollouts lost to truncation. {info['traces']} traces, {info['points']} "
        f"exit points, M = {info['samples']} continuations per exit point (temperature "
        f"{info['temperature']}), budget B = {info['budget']} tokens, seed {info['seed']}, model "
        f"{info['model']}. A rollout truncated at T is lost when its final answer is not complete within "
        f"T generated tokens. Green: lost rollouts that reached a correct answer when continued to B. "
        f"Grey: the other lost rollouts (wrong, or no answer even at B). Dashed, right axis: tokens "
        f"generated per exit point ({info['samples']} rollouts) when each is cut at T.{info['compute']}",
        width=int(fig.get_figwidth() * 19),
    )
    paths = _save(fig, out_dir, "fig3_truncation")
    plt.close(fig)
    return paths


def plot_variance(table: pl.DataFrame, info: Mapping[str, Any], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="white", context="paper")
    df = table.to_pandas()
    n_k = int(df["exit_points"].max())
    size = (max(8.0, 1.1 * n_k + 5), 0.22 * int(df["samples"].max()) + 2.5)
    fig, axes = plt.subplots(1, 2, figsize=size)
    panels = {
        "value_sd": "sd of the value v̂ at an exit point\n(mean over the first k exit points)",
        "reward_norm_sd": "sd of ||MC segment rewards||\nover the first k exit points",
    }
    for ax, (column, title) in zip(axes, panels.items(), strict=True):
        grid = df.pivot(index="samples", columns="exit_points", values=column).sort_index(ascending=False)
        grid = grid.astype(float).dropna(axis=1, how="all")  # k = 1 has no segment reward
        sns.heatmap(
            grid,
            ax=ax,
            cmap="viridis",
            annot=grid.size <= 300,
            fmt=".2f",
            annot_kws={"fontsize": 6},
            cbar_kws={"label": "bootstrap standard deviation"},
        )
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("number of exit points k (from exit 0, right after the prompt)")
        ax.set_ylabel("number of MC samples m")
    fig.tight_layout()
    counts = df.drop_duplicates("exit_points").sort_values("exit_points")["traces"].tolist()
    _caption(
        fig,
        f"Figure 7. Standard deviation of Monte Carlo estimates by bootstrap: {info['traces']} traces, "
        f"{info['points']} exit points, M = {info['samples']} continuations per exit point (budget B = "
        f"{info['budget']}, temperature {info['temperature']}), {info['bootstrap']} bootstrap resamples of "
        f"m rollouts drawn with replacement, seed {info['seed']}, model {info['model']}. Left: sd of the MC "
        f"value of one exit point, averaged over the trace's first k exit points. Right: sd of the Euclidean "
        f"norm of the MC segment-reward vector (v_(i+1) - v_i, i < k-1). Each cell is the mean over the "
        f"traces with at least k exit points (k = 1..{n_k}: {', '.join(map(str, counts))} traces).",
        width=int(fig.get_figwidth() * 19),
    )
    paths = _save(fig, out_dir, "fig7_mc_variance")
    plt.close(fig)
    return paths


def make_figures(
    traces: Sequence[Mapping[str, Any]],
    records: Sequence[Mapping[str, Any]],
    out_dir: str | Path,
    truncations: Sequence[int] | None,
    n_boot: int,
    seed: int,
    label: str | None = None,
    stats: Mapping[str, Any] | None = None,
) -> dict[str, Path]:
    """Write both figures (PNG, PDF) and their tables (CSV) under ``out_dir``; returns the paths.

    ``truncations``: the lengths T of Figure 3 (None: evenly spaced up to the budget); ``n_boot``
    bootstrap resamples seeded by ``seed`` (Figure 7); ``stats``: the MC run's compute
    (``study-mc --stats``), quoted in Figure 3's caption.
    """
    if not records:
        raise ValueError("no Monte Carlo records")
    out_dir = Path(out_dir)
    first = records[0]
    budget = int(max(r["max_new_tokens"] for r in records))
    info = {
        "traces": len({r["trace_id"] for r in records}),
        "points": len(records),
        "samples": first["samples"],
        "budget": budget,
        "temperature": first["temperature"],
        "seed": first["seed"],
        "bootstrap": n_boot,
        "model": label or first.get("model") or "?",
        "compute": "",
    }
    if stats:
        info["compute"] = (
            f" Measured: {stats['seconds_per_point']:.2f} s and {stats['tokens_per_point']:.0f} generated "
            f"tokens per exit point at B on {stats.get('device', '?')} ({stats.get('backend', '?')} backend)."
        )
    groups = trace_groups(traces)
    info["group_traces"] = defaultdict(int)
    for trace_id in {r["trace_id"] for r in records}:
        info["group_traces"][groups.get(trace_id, "all")] += 1
    info["group_traces"]["all"] = info["traces"]
    fig3 = truncation_table(records, groups, truncations or default_truncations(budget))
    fig7 = variance_table(records, n_boot, seed)
    paths = {"fig3_csv": _csv(fig3, out_dir / "fig3_truncation.csv")}
    paths |= dict(zip(("fig3_png", "fig3_pdf"), plot_truncation(fig3, info, out_dir), strict=True))
    paths["fig7_csv"] = _csv(fig7, out_dir / "fig7_mc_variance.csv")
    paths |= dict(zip(("fig7_png", "fig7_pdf"), plot_variance(fig7, info, out_dir), strict=True))
    return paths


def main(argv: Sequence[str] | None = None) -> None:
    from rredcot.infra.tracking import stage_run

    ap = argparse.ArgumentParser(
        prog="rredcot study-mc-figures",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--config", nargs="+", required=True, help="config YAML file(s): every setting")
    ap.add_argument("--traces", required=True, help="study traces (rredcot study-traces)")
    ap.add_argument("--mc", required=True, help="Monte Carlo records (rredcot study-mc)")
    ap.add_argument("--out-dir", required=True, type=Path)
    ap.add_argument("--truncations", type=int, nargs="+", help="truncation lengths T (default: 24 up to B)")
    ap.add_argument("--label", help="model name for the captions (default: the records' model path)")
    ap.add_argument("--mc-stats", help="compute of the MC run (study-mc --stats) for Figure 3's caption")
    args = ap.parse_args(argv)

    cfg = stage_config(args.config, "study_mc_figures")
    n_boot, seed = cfg["studies"]["bootstrap"], cfg["studies"]["seed"]
    traces, records = read_jsonl(args.traces), read_jsonl(args.mc)
    params = {k: str(v) for k, v in vars(args).items() if k != "config"} | {"bootstrap": n_boot, "seed": seed}
    with stage_run(cfg, "study-mc-figures", rule="study_mc_figures", seed=seed, params=params) as run:
        stats = read_json(args.mc_stats) if args.mc_stats else None
        paths = make_figures(traces, records, args.out_dir, args.truncations, n_boot, seed, args.label, stats)
        for path in paths.values():
            run.log_artifact(path)
        fig3 = pl.read_csv(paths["fig3_csv"]).filter(pl.col("group") == "all").sort("truncation")
        run.log_metrics({"lost_at_budget": fig3["lost"][-1], "points": len(records)})
        _log.info(f"{len(paths)} files under {args.out_dir}")


if __name__ == "__main__":
    setup_logging()
    main()
