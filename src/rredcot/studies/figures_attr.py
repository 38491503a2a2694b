"""Figures 4-6: how RREDCoT's segment credit relates to attribution methods, Monte Carlo values and a PRM.

- Figure 4 (``fig4_attribution_correlation``): for every pair of credit methods (RREDCoT, leave-one-out,
  gradient norm, MC), the Spearman rank correlation of their per-segment credits pooled over traces,
  using only the segments that lie within the last fraction f of the thinking tokens (counted from the
  right, f = 0.2 … 1.0), with log10 p-values in a second panel. The CSV also holds Pearson's r.
  ``fig4_attribution_correlation_value`` repeats it with LOO and gradient read on log v̂.
- Figure 5 (``fig5_prm_vs_nll``): Spearman correlation of the PRM's step score p_k and of its change
  Δp_k = p_k − p_{k−1} with the change of the thought NLL and of the reference answer NLL across the
  same segment (the two components of r̂_k = −ΔthoughtNLL_k − ΔanswerNLL_k when N = 1).
- Figure 6 (``fig6_prm_vs_rredcot``): PRM attribution (x) against RREDCoT's r̂_k (y), green for traces
  whose final answer is correct, red otherwise; PRM as is and PRM given the correct answer.

p-values come from the t distribution with n − 2 degrees of freedom (as scipy's ``spearmanr`` and
``pearsonr`` do), computed in log space so that tiny values do not underflow to 0. They count the
segments as independent pairs, which they are not: segments of one trace share its sampled path, and
traces drawn for one problem share its difficulty. Each Spearman ρ therefore also gets a 95% interval
from a bootstrap over problems (``spearman_low``, ``spearman_high``; ``clusters`` problems): whole
problems, with all their segments, are drawn with replacement, so every resample keeps that dependence.

CLI: ``rredcot study-attr-figures --attributions attributions.jsonl [--prm prm.jsonl] --out-dir DIR``
redraws the figures from the study outputs.
"""

from __future__ import annotations

import argparse
import logging
import math
from collections.abc import Mapping, Sequence
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from rredcot.infra.io import atomic_path
from rredcot.infra.logs import setup_logging
from rredcot.infra.stats import ClusterBootstrap

_log = logging.getLogger(__name__)

BOOTSTRAP_DRAWS = 1000
"""Resamples of the bootstrap over problems behind each Spearman interval."""
FRACTIONS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
LABELS = {
    "rredcot": "RREDCoT",
    "loo": "leave-one-out",
    "grad_norm": "gradient norm",
    "loo_value": "leave-one-out (log v̂)",
    "grad_norm_value": "gradient norm (log v̂)",
    "mc": "Monte Carlo",
}
METHODS = ("rredcot", "loo", "grad_norm", "mc")
VALUE_METHODS = ("rredcot", "loo_value", "grad_norm_value", "mc")
STEM = "fig4_attribution_correlation"
P_FLOOR = -20.0
VALUE_STEM = "fig4_attribution_correlation_value"


def log10_p(r: float, n: int) -> float:
    """log10 of the two-sided p-value of a correlation r over n pairs (t test, n − 2 dof)."""
    if n < 3 or not math.isfinite(r):
        return math.nan
    if abs(r) >= 1.0:
        return -math.inf
    t = abs(r) * math.sqrt((n - 2) / (1.0 - r * r))
    return (math.log(2.0) + float(stats.t.logsf(t, n - 2))) / math.log(10.0)


def cluster_interval(
    a: np.ndarray, b: np.ndarray, clusters: Sequence[Any], draws: int = BOOTSTRAP_DRAWS, seed: int = 0
) -> tuple[float, float]:
    """95% percentile interval of Spearman(a, b) when whole clusters (all their pairs at once) are drawn
    with replacement (``rredcot.infra.stats.ClusterBootstrap``); NaN with fewer than MIN_CLUSTERS
    clusters or where a resample has no spread."""
    boot = ClusterBootstrap(clusters, draws, seed)
    if not boot.enough:
        return math.nan, math.nan

    def rho(rows: np.ndarray) -> float:
        x, y = a[rows], b[rows]
        return math.nan if np.ptp(x) == 0 or np.ptp(y) == 0 else float(stats.spearmanr(x, y).statistic)

    rhos = np.array([rho(rows) for rows in boot.rows()])
    if not np.isfinite(rhos).all():
        return math.nan, math.nan
    # Linear-interpolated percentiles (scipy's quantile, at the levels scipy.stats.bootstrap's
    # percentile interval reads), unlike the order statistics of the other intervals: the recorded
    # Figure 4-6 intervals were computed so.
    tail = (1 - 0.95) / 2
    low, high = stats.quantile(rhos, np.array([tail, 1 - tail]))
    return float(low), float(high)


def correlate(
    x: Sequence[float | None], y: Sequence[float | None], clusters: Sequence[Any] | None = None
) -> dict[str, float]:
    """Spearman and Pearson correlation over the pairs where both values are finite; with ``clusters``
    (one label per pair, e.g. its problem), a 95% interval of Spearman's ρ by ``cluster_interval``."""
    a = np.array([np.nan if v is None else v for v in x], dtype=float)
    b = np.array([np.nan if v is None else v for v in y], dtype=float)
    keep = np.isfinite(a) & np.isfinite(b)
    a, b = a[keep], b[keep]
    n = int(keep.sum())
    out: dict[str, float] = {"n": n}
    constant = n < 3 or np.ptp(a) == 0 or np.ptp(b) == 0
    rho = math.nan if constant else float(stats.spearmanr(a, b).statistic)
    r = math.nan if constant else float(stats.pearsonr(a, b).statistic)
    out |= {"spearman": rho, "spearman_log10_p": log10_p(rho, n)}
    if clusters is not None:
        kept = [c for c, k in zip(clusters, keep, strict=True) if k]
        low, high = (math.nan, math.nan) if constant else cluster_interval(a, b, kept)
        out |= {"spearman_low": low, "spearman_high": high, "clusters": len(set(kept))}
    out |= {"pearson": r, "pearson_log10_p": log10_p(r, n)}
    return out


def correlation_by_fraction(
    rows: Sequence[Mapping[str, Any]],
    methods: Sequence[str],
    fractions: Sequence[float] = FRACTIONS,
) -> list[dict[str, Any]]:
    """One row per (method pair, fraction f): correlations over segments with ``from_right`` ≤ f, each
    Spearman ρ with its interval from a bootstrap over problems."""
    out = []
    for f in fractions:
        part = [r for r in rows if r["from_right"] <= f + 1e-9]
        problems = [r["problem_id"] for r in part]
        for a, b in combinations(methods, 2):
            c = correlate([r.get(a) for r in part], [r.get(b) for r in part], problems)
            out.append({"method_a": a, "method_b": b, "fraction": f, **c})
    return out


def _setup() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")
    return plt


def _save(fig: Any, out_dir: Path, stem: str) -> list[Path]:
    """PNG and PDF, each written atomically."""
    paths = []
    for suffix in (".png", ".pdf"):
        path = out_dir / f"{stem}{suffix}"
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=150, bbox_inches="tight")
        paths.append(path)
    return paths


def _write_csv(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    import polars as pl

    with atomic_path(path) as tmp:
        pl.DataFrame(list(rows)).write_csv(tmp)
    return path


def _counts(rows: Sequence[Mapping[str, Any]]) -> str:
    traces = {r["trace_id"] for r in rows}
    problems = {r.get("problem_id") for r in rows}
    seeds = sorted({str(r["seed"]) for r in rows if r.get("seed") is not None})
    sampled = f" (sampling seed{'s' if len(seeds) > 1 else ''} {', '.join(seeds)})" if seeds else ""
    return f"{len(traces)} traces{sampled} of {len(problems)} problems, {len(rows)} thinking segments"


def attribution_figure(
    rows: Sequence[Mapping[str, Any]],
    out_dir: Path,
    methods: Sequence[str] = METHODS,
    stem: str = STEM,
    fractions: Sequence[float] = FRACTIONS,
) -> list[Path]:
    """Figure 4 (PNG, PDF) and its table (CSV) from the per-segment rows of ``study-attribution``."""
    plt = _setup()
    table = correlation_by_fraction(rows, methods, fractions)
    paths = [_write_csv(table, out_dir / f"{stem}.csv")]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.0), sharex=True)
    palette = plt.get_cmap("tab10")
    for i, (a, b) in enumerate(combinations(methods, 2)):
        part = [t for t in table if t["method_a"] == a and t["method_b"] == b]
        xs = [t["fraction"] for t in part]
        style = {"color": palette(i), "marker": "o", "lw": 2.2 if "rredcot" in (a, b) else 1.2}
        style["ls"] = "-" if "mc" in (a, b) else "--"
        name = f"{LABELS.get(a, a)} vs {LABELS.get(b, b)}"
        axes[0].plot(xs, [t["spearman"] for t in part], label=name, **style)
        lows, highs = [t["spearman_low"] for t in part], [t["spearman_high"] for t in part]
        axes[0].fill_between(xs, lows, highs, color=palette(i), alpha=0.12, lw=0)
        # Tiny p-values (down to -inf at |ρ| = 1) are drawn at a floor so that they do not flatten the rest.
        axes[1].plot(xs, [max(t["spearman_log10_p"], P_FLOOR) for t in part], label=name, **style)
    axes[0].axhline(0.0, color="0.3", lw=0.8)
    axes[0].set_ylabel("Spearman rank correlation ρ\n(band: 95% interval, bootstrap over problems)")
    axes[1].axhline(math.log10(0.05), color="0.3", lw=0.8, ls=":")
    axes[1].text(fractions[-1], math.log10(0.05), "p = 0.05", ha="right", va="bottom", fontsize=7)
    axes[1].set_ylabel(f"log10 p-value (t test)\nvalues below {P_FLOOR:g} drawn at {P_FLOOR:g}")
    # Segments available at each fraction (pairs can have fewer where a method has no value).
    ticks = [f"{f:g}\n{sum(r['from_right'] <= f + 1e-9 for r in rows)}" for f in fractions]
    for ax in axes:
        ax.set_xticks(list(fractions), ticks, fontsize=7)
        ax.set_xlabel("fraction f of the thinking part, counted from the right\n(below: segments within it)")
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="center left", bbox_to_anchor=(0.99, 0.5), frameon=False, fontsize=8)
    mc = [r["mc_samples"] for r in rows if r.get("mc") is not None]
    m = f"{int(np.median(mc))} rollouts per exit point" if mc else "no MC values"
    objective = (
        "log v̂ (thought + answer)" if any(x.endswith("_value") for x in methods) else "answer log-likelihood"
    )
    fig.suptitle(
        "Per-segment credit methods: Spearman correlation of segments pooled over traces "
        f"(LOO and gradient on the {objective})\n"
        f"{_counts(rows)}; MC: {m}; at fraction f only segments within the last f of the thinking tokens",
        fontsize=9,
    )
    fig.tight_layout()
    paths += _save(fig, out_dir, stem)
    plt.close(fig)
    return paths


PRM_X = {"prm_score": "PRM step score p_k", "prm_delta": "PRM step-score change Δp_k"}
NLL_Y = {"d_thought_nll": "Δ thought NLL across segment", "d_answer_nll": "Δ answer NLL across segment"}


def prm_nll_table(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Correlations of PRM scores (as is and given the answer) with the two NLL changes, each Spearman ρ
    with its interval from a bootstrap over problems."""
    out = []
    problems = [r["problem_id"] for r in rows]
    for given in (False, True):
        suffix = "_given_answer" if given else ""
        for x in PRM_X:
            for y in NLL_Y:
                c = correlate([r.get(x + suffix) for r in rows], [r.get(y) for r in rows], problems)
                out.append({"prm": x, "given_answer": given, "nll": y, **c})
    return out


def _annotate(ax: Any, c: Mapping[str, float]) -> None:
    text = f"Spearman ρ = {c['spearman']:.2f}"
    if "spearman_low" in c:
        text += f" [{c['spearman_low']:.2f}, {c['spearman_high']:.2f}]"
    text += f"\nlog10 p = {c['spearman_log10_p']:.1f}\nn = {c['n']}"
    ax.text(
        0.02, 0.98, text, transform=ax.transAxes, va="top", fontsize=7, bbox={"fc": "white", "alpha": 0.8}
    )


def prm_nll_figure(rows: Sequence[Mapping[str, Any]], out_dir: Path, prm_name: str = "PRM") -> list[Path]:
    """Figure 5 (PNG, PDF) and its table (CSV): PRM step scores against the NLL changes."""
    plt = _setup()
    table = prm_nll_table(rows)
    paths = [_write_csv(table, out_dir / "fig5_prm_vs_nll.csv")]
    fig, axes = plt.subplots(2, 2, figsize=(8.5, 7.0))
    for i, (x, xlabel) in enumerate(PRM_X.items()):
        for j, (y, ylabel) in enumerate(NLL_Y.items()):
            ax = axes[i, j]
            pts = [(r[x], r[y]) for r in rows if r.get(x) is not None and r.get(y) is not None]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.scatter(xs, ys, s=6, alpha=0.35, color="tab:blue", edgecolors="none")
            c = next(t for t in table if t["prm"] == x and t["nll"] == y and not t["given_answer"])
            _annotate(ax, c)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
    fig.suptitle(
        f"{prm_name} step scores vs the two RREDCoT components (NLL change across each thinking segment)\n"
        f"{_counts(rows)}; Spearman rank correlation [95% interval, bootstrap over problems], "
        "t-test p-value (segments counted as independent)",
        fontsize=9,
    )
    fig.tight_layout()
    paths += _save(fig, out_dir, "fig5_prm_vs_nll")
    plt.close(fig)
    return paths


def prm_rredcot_figure(
    rows: Sequence[Mapping[str, Any]], out_dir: Path, prm_name: str = "PRM", x: str = "prm_score"
) -> list[Path]:
    """Figure 6 (PNG, PDF): PRM attribution vs RREDCoT r̂_k, coloured by the final answer's correctness."""
    plt = _setup()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), sharey=True)
    table = []
    for ax, given in zip(axes, (False, True), strict=True):
        key = x + ("_given_answer" if given else "")
        for correct, color, name in ((True, "tab:green", "correct"), (False, "tab:red", "incorrect")):
            pts = [
                (r[key], r["rredcot"])
                for r in rows
                if r["correct"] is correct and r.get(key) is not None and r.get("rredcot") is not None
            ]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.scatter(
                    xs, ys, s=8, alpha=0.45, color=color, edgecolors="none", label=f"final answer {name}"
                )
        c = correlate([r.get(key) for r in rows], [r.get("rredcot") for r in rows])
        table.append({"prm": key, **c})
        _annotate(ax, c)
        ax.axhline(0.0, color="0.3", lw=0.8)
        ax.set_title("PRM given the correct answer" if given else "PRM as is", fontsize=9)
        ax.set_xlabel(PRM_X[x])
    axes[0].set_ylabel("RREDCoT segment reward r̂_k")
    axes[0].legend(loc="lower right", fontsize=7)
    fig.suptitle(
        f"{prm_name} attribution vs RREDCoT attribution per thinking segment\n"
        f"{_counts(rows)}; Spearman rank correlation over all segments",
        fontsize=9,
    )
    fig.tight_layout()
    paths = [_write_csv(table, out_dir / "fig6_prm_vs_rredcot.csv")]
    paths += _save(fig, out_dir, "fig6_prm_vs_rredcot")
    plt.close(fig)
    return paths


def main(argv: Sequence[str] | None = None) -> None:
    from rredcot.infra.io import read_jsonl
    from rredcot.infra.tracking import stage_run
    from rredcot.settings.reads import stage_config

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", nargs="+", required=True, help="config YAML file(s), later ones override")
    ap.add_argument("--attributions", help="per-segment credits of study-attribution (JSONL): Figure 4")
    ap.add_argument("--prm", help="per-segment PRM scores of study-prm (JSONL): Figures 5 and 6")
    ap.add_argument("--prm-name", default="PRM", help="name of the PRM in the figure titles")
    ap.add_argument("--prm-attribution", choices=tuple(PRM_X), default="prm_score", help="Figure 6's x axis")
    ap.add_argument("--out-dir", required=True, type=Path)
    args = ap.parse_args(argv)
    cfg = stage_config(args.config, "study_attr_figures")
    params = {"attributions": args.attributions, "prm": args.prm, "prm_attribution": args.prm_attribution}
    with stage_run(cfg, "study-attr-figures", rule="study_attr_figures", params=params) as run:
        paths: list[Path] = []
        if args.attributions:
            rows = read_jsonl(args.attributions)
            paths += attribution_figure(rows, args.out_dir)
            paths += attribution_figure(rows, args.out_dir, VALUE_METHODS, VALUE_STEM)
        if args.prm:
            rows = read_jsonl(args.prm)
            paths += prm_nll_figure(rows, args.out_dir, args.prm_name)
            paths += prm_rredcot_figure(rows, args.out_dir, args.prm_name, args.prm_attribution)
        for path in paths:
            run.log_artifact(path)
            _log.info(f"{path}")


if __name__ == "__main__":
    setup_logging()
    main()
