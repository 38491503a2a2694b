"""The credit-fidelity table and figure (``rredcot study-fidelity``): each credit method's agreement
with the exact values against what it cost, one point per method (and Monte Carlo budget) with its
95% interval from the bootstrap over problems, cost on a log scale."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rredcot.infra.io import atomic_path

COLUMNS = (
    "key",
    "method",
    "samples",
    "traces",
    "problems",
    "segments",
    "rho_pooled",
    "rho_pooled_low",
    "rho_pooled_high",
    "rho_trace",
    "rho_trace_low",
    "rho_trace_high",
    "traces_ranked",
    "culprit_hit",
    "culprit_hit_low",
    "culprit_hit_high",
    "wrong_located",
    "sign_agreement",
    "sign_agreement_low",
    "sign_agreement_high",
    "right_segments",
    "seconds",
    "seconds_per_trace",
    "seconds_per_token",
    "rollouts_per_trace",
)
"""The table's columns, in order."""

COST_FLOOR = 1e-6
"""Seconds per trace drawn for a method that costs less (uniform credit computes nothing)."""


def write_table(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """The table as CSV, written atomically."""
    import polars as pl

    frame = pl.DataFrame([{c: r.get(c) for c in COLUMNS} for r in rows], infer_schema_length=None)
    with atomic_path(path) as tmp:
        frame.write_csv(tmp)
    return path


def label(row: Mapping[str, Any]) -> str:
    return f"{row['method']} M={row['samples']}" if row.get("samples") is not None else str(row["method"])


def plot_fidelity(rows: Sequence[Mapping[str, Any]], info: Mapping[str, Any], path: Path) -> list[Path]:
    """Per-trace and pooled ρ against seconds per trace; Monte Carlo's budgets joined by a line.
    Writes ``path`` (PNG) and the same name with ``.pdf``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")
    methods = list(dict.fromkeys(r["method"] for r in rows))
    colors = dict(zip(methods, sns.color_palette("deep", len(methods)), strict=True))
    fig, axes = plt.subplots(1, 2, figsize=(10.0, 4.2), sharex=True)
    panels = {
        "rho_trace": "Spearman ρ with the exact value change\n(mean over traces with ≥ 3 segments)",
        "rho_pooled": "Spearman ρ with the exact value change\n(pooled over every segment)",
    }
    for ax, (measure, title) in zip(axes, panels.items(), strict=True):
        for method in methods:
            part = sorted((r for r in rows if r["method"] == method), key=lambda r: r["samples"] or 0)
            x = [max(float(r["seconds_per_trace"]), COST_FLOOR) for r in part]
            y = [float(r[measure]) for r in part]
            low = [float(r[f"{measure}_low"]) for r in part]
            high = [float(r[f"{measure}_high"]) for r in part]
            err = [
                [v - lo if math.isfinite(lo) else 0.0 for v, lo in zip(y, low, strict=True)],
                [hi - v if math.isfinite(hi) else 0.0 for v, hi in zip(y, high, strict=True)],
            ]
            ax.errorbar(
                x,
                y,
                yerr=err,
                fmt="o-" if len(part) > 1 else "o",
                color=colors[method],
                capsize=3,
                ms=5,
                lw=1.2,
                label=method,
            )
            for r, xi, yi in zip(part, x, y, strict=True):
                if r.get("samples") is not None:
                    ax.annotate(
                        f"M={r['samples']}", (xi, yi), textcoords="offset points", xytext=(4, -10), fontsize=7
                    )
        ax.set_xscale("log")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("wall seconds of credit per trace (log scale)")
        ax.axhline(0.0, color="0.5", lw=0.8)
    axes[0].set_ylabel("rank correlation (bar: 95% interval, bootstrap over problems)")
    # Beside the panels, not on them: the points fill both panels' ranges.
    handles, labels = axes[1].get_legend_handles_labels()
    fig.tight_layout()
    fig.legend(handles, labels, fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    skipped = info.get("skipped") or {}
    comparison = info.get("comparison")
    versus = ""
    if comparison:
        versus = (
            f" RREDCoT - Monte Carlo at the budget nearest its cost (M = {comparison['samples']}, "
            f"{comparison['cost_ratio']:.2f}x RREDCoT's seconds): ρ within a trace "
            f"{comparison['rho_trace_diff']:+.3f} "
            f"[{comparison['rho_trace_diff_low']:.3f}, {comparison['rho_trace_diff_high']:.3f}]."
        )
    caption = (
        f"Credit fidelity. Every registered credit method on the same {info['traces']} traces "
        f"({info['tokens']} completion tokens) of the model RL starts from, judged by the exact values of "
        f"the synthetic task: per segment of RREDCoT's exit points, the credit a method pays (its token "
        f"advantages summed over the segment) against the exact value change across it. Cost: wall "
        f"seconds of the method's credit assignment per trace on {info['device']} "
        f"(points below {COST_FLOOR:g} s are drawn at it). Intervals: {info['bootstrap']} "
        f"resamples of whole problems, seed {info['seed']}.{versus}"
        + (f" Skipped: {', '.join(f'{k} ({v})' for k, v in skipped.items())}." if skipped else "")
    )
    fig.text(0.0, -0.01, textwrap.fill(caption, 190), ha="left", va="top", fontsize=7.5)
    paths = [path, path.with_suffix(".pdf")]
    for p in paths:
        with atomic_path(p) as tmp:
            fig.savefig(tmp, dpi=150, bbox_inches="tight", format=p.suffix.lstrip("."))
    plt.close(fig)
    return paths
