"""The cost table: per-arm step times, credit seconds and the two step-time ratios."""

from __future__ import annotations

import json
from pathlib import Path

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


def _evaluation(folder, arm: str, seed: int, greedy: list[int], sampled: list[list[int]]) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    summary = folder / f"{arm}-seed{seed}.summary.json"
    summary.write_text(json.dumps({"arm": arm, "seed": seed, "benchmarks": {}}))
    rows = [
        {"id": f"p{i}", "greedy_correct": bool(g), "sample_correct": [bool(x) for x in s]}
        for i, (g, s) in enumerate(zip(greedy, sampled, strict=True))
    ]
    (folder / f"{arm}-seed{seed}.records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(summary)


def test_paired_table_against_the_first_arm(tmp_path):
    from rredcot.stages.report import paired_table

    cfg = load_config("config/config.yaml", {"run_arms": ["grpo", "oracle"], "studies": {"bootstrap": 200}})
    summaries, curves = [], []
    for seed in (0, 1, 2):
        # The oracle solves 6 of 8 problems greedily, GRPO 3; sampled: 1 of 2 samples more per problem.
        summaries.append(_evaluation(tmp_path, "grpo", seed, [1, 1, 1, 0, 0, 0, 0, 0], [[1, 0]] * 8))
        summaries.append(_evaluation(tmp_path, "oracle", seed, [1, 1, 1, 1, 1, 1, 0, 0], [[1, 1]] * 8))
        curve = tmp_path / f"curve{seed}.csv"
        lines = ["arm,seed,step,greedy,sampled"]
        lines += [f"grpo,{seed},{t},{g},{g}" for t, g in zip((0, 10, 20), (0.1, 0.2, 0.375), strict=True)]
        lines += [f"oracle,{seed},{t},{g},{g}" for t, g in zip((0, 10, 20), (0.1, 0.4, 0.75), strict=True)]
        curve.write_text("\n".join(lines) + "\n")
        curves.append(str(curve))
    table = {r["metric"]: r for r in paired_table(cfg, summaries, curves).to_dicts()}
    greedy, sampled = table["greedy"], table["sampled"]
    assert (greedy["arm"], greedy["reference"], greedy["seeds"], greedy["problems"]) == (
        "Oracle",
        "GRPO",
        3,
        8,
    )
    assert greedy["diff"] == pytest.approx(3 / 8) and 0 < greedy["diff_low"] <= greedy["diff_high"]
    assert sampled["diff"] == pytest.approx(0.5) and sampled["diff_low"] == sampled["diff_high"] == 0.5
    # GRPO ends at 0.375; the oracle's mean curve is past it at step 10.
    assert greedy["steps_to_reference"] == 10 and greedy["steps_low"] == greedy["steps_high"] == 10


def test_paired_curves_subtract_the_reference_of_the_same_seed_and_step():
    import polars as pl

    from rredcot.stages.report import paired_curves

    curve = pl.DataFrame(
        {
            "arm": ["grpo"] * 4 + ["oracle"] * 5,
            "seed": [0, 0, 1, 1, 0, 0, 1, 1, 2],
            "step": [0, 10, 0, 10, 0, 10, 0, 10, 0],
            "greedy": [0.5, 0.6, 0.4, 0.5, 0.5, 0.7, 0.4, 0.4, 0.9],
            "sampled": [0.2, 0.3, 0.1, 0.2, 0.2, 0.5, 0.1, 0.25, 0.9],
        }
    )
    diff = paired_curves(curve, "grpo")
    assert diff["arm"].to_list() == ["oracle"] * 4  # seed 2 has no GRPO run to pair with
    assert diff["seed"].to_list() == [0, 0, 1, 1] and diff["step"].to_list() == [0, 10, 0, 10]
    assert diff["greedy"].to_list() == pytest.approx([0.0, 0.1, 0.0, -0.1])
    assert diff["sampled"].to_list() == pytest.approx([0.0, 0.2, 0.0, 0.05])


def test_learning_curve_figure_adds_the_paired_panel_with_a_second_arm(tmp_path):
    from PIL import Image

    from rredcot.stages.report import plot_curves

    curves = []
    for seed in (0, 1):
        curve = tmp_path / f"curve{seed}.csv"
        lines = ["arm,seed,step,greedy,sampled"]
        for arm, gain in (("grpo", 0.1), ("oracle", 0.2)):
            lines += [f"{arm},{seed},{t},0.5,{0.3 + gain * t / 10 + 0.01 * seed}" for t in (0, 10, 20)]
        curve.write_text("\n".join(lines) + "\n")
        curves.append(str(curve))
    widths = {}
    for arms in (["grpo"], ["grpo", "oracle"]):
        cfg = load_config("config/config.yaml", {"run_arms": arms, "studies": {"bootstrap": 50}})
        out = tmp_path / f"curve_{len(arms)}.png"
        plot_curves(cfg, curves if len(arms) == 2 else [_only(c, "grpo") for c in curves], out)
        widths[len(arms)] = Image.open(out).size[0]
        assert out.with_suffix(".pdf").exists()
    assert widths[2] > 1.3 * widths[1]  # three panels against two


def _only(path: str, arm: str) -> str:
    """A copy of a curve file with one arm's rows."""
    header, *rows = Path(path).read_text().splitlines()
    out = Path(f"{path}.{arm}.csv")
    out.write_text("\n".join([header, *(row for row in rows if row.startswith(f"{arm},"))]) + "\n")
    return str(out)
