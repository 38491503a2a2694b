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
    # Neither keeps a model beside the policy.
    assert grpo["extra_memory_gib"] is None and rredcot["extra_model_s_per_step"] is None


def test_cost_table_counts_the_models_a_credit_keeps_beside_the_policy(tmp_path):
    """PRIME's implicit PRM: the most memory it held at any step of any seed, and its seconds per step
    as the credit's are taken (the median after the first step, the mean over seeds)."""
    cfg = load_config("config/config.yaml", {"run_arms": ["grpo", "prime"]})
    train = tmp_path / "train"
    _metrics(train / "grpo" / "seed0" / "metrics.jsonl", [(9.0, None), (1.0, None), (1.0, None)])
    for seed, (memory, seconds) in enumerate((([1.5, 2.0, 2.0], [5.0, 0.4, 0.6]), ([1.5, 2.5], [5.0, 0.2]))):
        path = train / "prime" / f"seed{seed}" / "metrics.jsonl"
        path.parent.mkdir(parents=True)
        rows = [
            {"step": i, "step_time": 2.0, "credit/seconds": 1.0, "prime/memory_gib": m, "prime/seconds": s}
            for i, (m, s) in enumerate(zip(memory, seconds, strict=True))
        ]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = cost_table(cfg, tmp_path / "benchmarks", train, None)
    rows = {r["item"]: r for r in table.to_dicts()}
    prime, grpo = rows["PRIME"], rows["GRPO"]
    assert prime["extra_memory_gib"] == 2.5
    assert prime["extra_model_s_per_step"] == pytest.approx((0.5 + 0.2) / 2)
    assert grpo["extra_memory_gib"] is None and grpo["extra_model_s_per_step"] is None
    assert table.columns[-2:] == ["extra_memory_gib", "extra_model_s_per_step"]


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


def _report_view(arms: list[str], **report):
    """The report stage's view of the default config with these run arms: what its rule hands it."""
    from rredcot.settings.reads import stage_view

    overrides = {"run_arms": arms, "studies": {"bootstrap": 200}} | ({"report": report} if report else {})
    return stage_view(load_config("config/config.yaml", overrides), "report")


def _pairs(table) -> list[tuple[str, str]]:
    """The (arm, reference) pairs of a paired or compute table, in order."""
    return list(dict.fromkeys(zip(table["arm"], table["reference"], strict=True)))


def test_paired_table_adds_the_configured_pairs(tmp_path, caplog):
    from rredcot.settings.config import ConfigError
    from rredcot.stages.report import paired_table

    summaries = []
    for seed in (0, 1, 2):
        # Greedy: GRPO solves 3 of 8 problems, RREDCoT 5, MC 6; sampled: one of two samples each.
        for arm, solved in (("grpo", 3), ("rredcot", 5), ("mc", 6)):
            greedy = [1] * solved + [0] * (8 - solved)
            summaries.append(_evaluation(tmp_path, arm, seed, greedy, [[1, 0]] * 8))
    table = paired_table(_report_view(["grpo", "rredcot", "mc"]), summaries, [])
    rows = {(r["arm"], r["reference"], r["metric"]): r for r in table.to_dicts()}
    # Every arm against the first arm, then report.pairs' default: RREDCoT against Monte Carlo credit.
    assert _pairs(table) == [("RREDCoT", "GRPO"), ("MC", "GRPO"), ("RREDCoT", "MC")]
    assert rows[("RREDCoT", "MC", "greedy")]["diff"] == pytest.approx(-1 / 8)
    assert rows[("MC", "GRPO", "greedy")]["diff"] == pytest.approx(3 / 8)
    assert rows[("RREDCoT", "MC", "sampled")]["diff"] == 0.0
    assert rows[("RREDCoT", "MC", "greedy")]["seeds"] == 3
    # A pair that is already one against the first arm is not repeated.
    view = _report_view(["grpo", "rredcot", "mc"], pairs=[["rredcot", "grpo"], ["mc", "rredcot"]])
    again = paired_table(view, summaries, [])
    assert _pairs(again) == [("RREDCoT", "GRPO"), ("MC", "GRPO"), ("MC", "RREDCoT")]
    # Without the MC arm in the run, the pair is skipped, and the log says why.
    with caplog.at_level("INFO", logger="rredcot.stages.report"):
        two = paired_table(_report_view(["grpo", "rredcot"]), summaries, [])
    assert set(zip(two["arm"], two["reference"], strict=True)) == {("RREDCoT", "GRPO")}
    assert "rredcot against mc skipped, the run does not train mc" in caplog.text
    # A pair must name two different configured arms.
    for pairs, message in (([["rredcot", "nope"]], "unknown arm"), ([["mc", "mc"]], "two different arms")):
        with pytest.raises(ConfigError, match=message):
            load_config("config/config.yaml", {"report": {"pairs": pairs}})


def _training_run(train, arm: str, seed: int, step_seconds: float, sampled: list[float]) -> None:
    """curve.csv (probes at steps 0, 10, 20) and metrics.jsonl (every step at ``step_seconds``) of
    one training job, as the train rule writes them."""
    folder = train / arm / f"seed{seed}"
    folder.mkdir(parents=True)
    lines = ["arm,seed,step,greedy,sampled"]
    lines += [f"{arm},{seed},{t},nan,{a}" for t, a in zip((0, 10, 20), sampled, strict=True)]
    (folder / "curve.csv").write_text("\n".join(lines) + "\n")
    rows = [{"step": s, "loss": 0.1, "step_time": step_seconds} for s in range(1, 21)]
    rows.append({"step": 20, "train_runtime": 99.0})  # the trainer's summary, not a step
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_compute_table_puts_the_curves_on_training_seconds(tmp_path):
    from rredcot.stages.report import compute_table

    train = tmp_path / "train"
    # Seed 1 ran on a machine twice as slow; an MC step costs twice a RREDCoT one, GRPO's 1.5 times.
    for seed, slow in ((0, 1.0), (1, 2.0)):
        _training_run(train, "rredcot", seed, 1.0 * slow, [0.2, 0.6, 1.0])
        _training_run(train, "grpo", seed, 1.5, [0.2, 0.5, 0.7])
    _training_run(train, "mc", 0, 2.0, [0.2, 0.6, 0.8])
    _training_run(train, "mc", 1, 4.0, [0.2, 0.4, 0.9])
    curves = sorted(map(str, train.glob("*/seed*/curve.csv")))
    metrics = sorted(map(str, train.glob("*/seed*/metrics.jsonl")))
    table = compute_table(_report_view(["grpo", "rredcot", "mc"]), curves, metrics)
    assert table.columns == [
        "arm",
        "reference",
        "seeds",
        "arm_seconds",
        "reference_seconds",
        "cost_share",
        "equal_compute_diff",
        "equal_compute_low",
        "equal_compute_high",
        "reach_share",
        "reach_low",
        "reach_high",
    ]
    rows = {(r["arm"], r["reference"]): r for r in table.to_dicts()}
    assert list(rows) == [("RREDCoT", "GRPO"), ("MC", "GRPO"), ("RREDCoT", "MC")]
    mc = rows[("RREDCoT", "MC")]
    assert (mc["seeds"], mc["arm_seconds"], mc["reference_seconds"], mc["cost_share"]) == (2, 30.0, 60.0, 0.5)
    # At equal compute (20 s, 40 s) RREDCoT has finished at 1.0; MC stands at 0.6, then 0.4.
    assert mc["equal_compute_diff"] == pytest.approx(0.5)
    assert mc["equal_compute_low"] == pytest.approx(0.4) and mc["equal_compute_high"] == pytest.approx(0.6)
    # RREDCoT's mean curve (0.2, 0.6, 1.0 at 0, 15, 30 s) reaches MC's final 0.85 at 24.375 s of 60.
    assert mc["reach_share"] == pytest.approx(24.375 / 60, abs=1e-4)
    assert mc["reach_low"] == pytest.approx(15 / 40) and mc["reach_high"] == pytest.approx(35 / 80, abs=1e-4)
    # MC against GRPO: 40 s and 80 s against GRPO's 30 s; MC's mean curve (0.2, 0.5, 0.85 at 0, 30,
    # 60 s) passes GRPO's final 0.7 at 30 + 0.2 / 0.35 * 30 s, past GRPO's whole run.
    assert rows[("MC", "GRPO")]["cost_share"] == pytest.approx((40 / 30 + 80 / 30) / 2, abs=1e-4)
    assert rows[("MC", "GRPO")]["reach_share"] == pytest.approx((30 + 0.2 / 0.35 * 30) / 30, abs=1e-4)
    # A seed without its step times is left out of the pairs with that arm.
    without = [m for m in metrics if "mc/seed1" not in m]
    table = compute_table(_report_view(["grpo", "rredcot", "mc"]), curves, without)
    assert table["seeds"].to_list() == [2, 1, 1]


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
