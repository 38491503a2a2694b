"""The workflow end to end on the smoke config: every stage runs, outputs and MLflow runs exist."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from mlflow import MlflowClient

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]


def _run(args: list[str], results: Path, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("RREDCOT_INVOCATION", None)
    cmd = [*SNAKEMAKE, "--configfile", "config/smoke.yaml", "--config", f"results_dir={results}", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, **kw)


def test_bad_config_fails_before_any_job(tmp_path):
    proc = _run(["-n", "--config", f"results_dir={tmp_path}", "rl={'max_stepz': 1}"], tmp_path)
    assert proc.returncode != 0
    assert "max_stepz" in proc.stdout + proc.stderr


def test_dry_run_lists_every_stage(tmp_path):
    proc = _run(["-n", "--quiet", "rules"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    for rule in ("data", "clean", "sft", "train", "evaluate", "report", "tables", "study_mc", "study_prm"):
        assert rule in proc.stdout


@pytest.mark.slow
def test_smoke_workflow(tmp_path):
    results = tmp_path / "results"
    proc = _run(["--cores", "2", "all"], results, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]

    table = pl.read_csv(results / "table1.csv")
    labels = ["grpo", "rredcot", "entropy", "rredcot+entropy", "bnpo", "dr.grpo", "dapo"]
    assert {"benchmark", "metric", "base_sft_mean", *(f"{a}_mean" for a in labels)} <= set(table.columns)
    assert set(table["grpo_seeds"].to_list()) == {2}
    assert "all" in table["benchmark"].to_list()
    assert (results / "figures" / "learning_curve.png").stat().st_size > 5000
    assert (results / "figures" / "learning_curve.pdf").exists()
    # Every table and the analyses' figures (PNG and PDF), from the one `all` target.
    for name in (
        "fig3_truncation",
        "fig4_attribution_correlation",
        "fig5_prm_vs_nll",
        "fig6_prm_vs_rredcot",
        "fig7_mc_variance",
    ):
        for ext in ("png", "pdf"):
            assert (results / "figures" / f"{name}.{ext}").stat().st_size > 1000, name
    localisation = json.loads((results / "studies" / "analysis" / "localisation.json").read_text())
    # The smoke model writes noise (no exit, no equations), so few or no traces have a culprit.
    assert localisation["all"]["traces"] == len(localisation["traces"])
    assert set(localisation) == {"all", "thinking", "answer", "traces"}
    table2 = pl.read_csv(results / "table2.csv")
    assert {"benchmark", "base_mean", "grpo_mean", "rredcot_mean", "paper_open_rs"} <= set(table2.columns)
    cost = pl.read_csv(results / "cost.csv")
    assert {"GRPO", "RREDCoT"} <= set(cost["item"].to_list()) and "study" in cost["kind"].to_list()
    items = cost["item"].to_list()
    within = dict(zip(items, cost["step_ratio_within_run"].to_list(), strict=True))
    credit_s = dict(zip(items, cost["credit_s_per_step"].to_list(), strict=True))
    # Uniform credit costs nothing. The smoke policy's groups mostly tie (no advantage, no credit to
    # compute), so RREDCoT's rounded credit time may read 0 here; test_tables checks the ratios.
    assert within["GRPO"] == 1.0 and credit_s["GRPO"] == 0.0
    assert within["RREDCoT"] >= 1.0 and credit_s["RREDCoT"] >= 0.0

    report = json.loads((results / "clean" / "report.json").read_text())
    assert report["flagged_fraction"] == pytest.approx(0.15)
    assert report["noise"]["precision"] == pytest.approx(1.0) and report["noise"]["recall"] == pytest.approx(
        1.0
    )
    flags = (results / "clean" / "rl.flags.jsonl").read_text().splitlines()
    assert len(flags) == 200  # one flags row per RL row

    for log in ("data", "clean", "sft", "report"):
        assert (results / "logs" / f"{log}.log").exists()
    assert (results / "benchmarks" / "sft.tsv").exists()

    # One MLflow run per job (1 data + 1 clean + 1 sft + 7x2 train + 8x2 eval + 1 report + 1 tables
    # + 2 trace sets, 2 MC runs, MC figures, attribution, PRM training and scoring, attribution figures,
    # blame localisation).
    client = MlflowClient(tracking_uri=f"sqlite:///{results}/mlflow.db")
    exp = client.get_experiment_by_name("rredcot-smoke")
    runs = client.search_runs([exp.experiment_id], max_results=500)
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    parents = {r.data.tags["mlflow.parentRunId"] for r in children}
    assert len(children) == 45 and len(parents) == 1
    assert all(r.info.status == "FINISHED" for r in children)
    train = [r for r in children if r.data.tags.get("rredcot.rule") == "train"]
    arms = ["bnpo", "dapo", "dr_grpo", "entropy", "grpo", "rredcot", "rredcot_entropy"]
    assert sorted((r.data.tags["rredcot.arm"], r.data.tags["rredcot.seed"]) for r in train) == [
        (arm, seed) for arm in arms for seed in ("0", "1")
    ]
    # Which arm is which: credit method and loss type are tags of every train run.
    kinds = {
        r.data.tags["rredcot.arm"]: (r.data.tags["rredcot.credit_method"], r.data.tags["rredcot.loss_type"])
        for r in train
    }
    assert kinds["rredcot_entropy"] == ("rredcot+entropy", "grpo") and kinds["dr_grpo"] == (
        "uniform",
        "dr_grpo",
    )
    for run in train:
        history = client.get_metric_history(run.info.run_id, "heldout_sampled_accuracy")
        assert [m.step for m in history] == [0, 1, 2]
        assert client.list_artifacts(run.info.run_id)
    rred = next(r for r in train if r.data.tags["rredcot.arm"] == "rredcot")
    assert "credit/traces" in rred.data.metrics  # logged every step, also when no trace needs credit
    assert "perf/step_seconds" in rred.data.metrics
    # Credit pictures of the first step, on disk and in MLflow (when a trace needed credit).
    views = sorted((results / "train").glob("rredcot*/seed*/credit/step00000/trace_0.png"))
    if views:
        assert (views[0].parent / "traces.jsonl").exists() and (views[0].parent / "trace_0.html").exists()
        owner = views[0].parents[3].name, views[0].parents[2].name.removeprefix("seed")
        run = next(r for r in train if (r.data.tags["rredcot.arm"], r.data.tags["rredcot.seed"]) == owner)
        assert [a.path for a in client.list_artifacts(run.info.run_id, "credit")] == ["credit/step00000"]

    # A second invocation has nothing to do: outputs are complete and up to date.
    again = _run(["--cores", "2", "all", "-n"], results)
    assert "Nothing to be done" in again.stdout + again.stderr
