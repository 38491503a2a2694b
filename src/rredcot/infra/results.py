"""Reading the workflow's result files: evaluation summaries (and their arms and seeds)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import polars as pl

BASE = "base"


def load_summaries(paths: Sequence[str | Path]) -> pl.DataFrame:
    """Long table: arm, seed, benchmark, metric, value."""
    rows = []
    for path in paths:
        with open(path) as fh:
            s = json.load(fh)
        for bench, stats in s["benchmarks"].items():
            for metric, value in stats.items():
                if metric != "n":
                    rows.append(
                        {
                            "arm": s["arm"],
                            "seed": int(s["seed"]),
                            "benchmark": bench,
                            "metric": metric,
                            "value": float(value),
                        }
                    )
    return pl.DataFrame(rows)
