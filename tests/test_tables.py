"""The cost table: per-arm step times, credit seconds and the two step-time ratios."""

from __future__ import annotations

import json

import pytest

from rredcot.settings.config import load_config
from rredcot.stages.tables import cost_table


def _metrics(path, steps: list[tuple[float, float | None]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [
        {"step": i, "step_time": t} | ({} if c is None else {"credit/seconds": c})
        for i, (t, c) in enumerate(steps)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_cost_table_ratios(tmp_path):
    cfg = load_config("config/config.yaml", {"run_arms": ["grpo", "rredcot"]})
    train = tmp_path / "train"
    # The first step warms up and is skipped; medians of the rest.
    _metrics(train / "grpo" / "seed0" / "metrics.jsonl", [(9.0, None), (1.0, None), (1.2, None), (1.1, None)])
    _metrics(train / "rredcot" / "seed0" / "metrics.jsonl", [(9.0, 5.0), (1.5, 0.5), (1.2, 0.2), (1.2, 0.3)])
    table = cost_table(cfg, tmp_path / "benchmarks", train, None)
    rows = {r["item"]: r for r in table.to_dicts()}
    grpo, rredcot = rows["GRPO"], rows["RREDCoT"]
    assert grpo["step_s"] == pytest.approx(1.1) and grpo["credit_s_per_step"] == 0.0
    assert grpo["step_ratio_within_run"] == 1.0 and grpo["step_ratio_to_grpo"] == 1.0
    assert rredcot["step_s"] == pytest.approx(1.2) and rredcot["credit_s_per_step"] == pytest.approx(0.3)
    # Within the run: the median over steps of step / (step - credit) = median(1.5, 1.2, 1.333).
    assert rredcot["step_ratio_within_run"] == pytest.approx(1.333, abs=1e-3)
    assert rredcot["step_ratio_to_grpo"] == pytest.approx(1.2 / 1.1, abs=1e-3)
