"""The workflow end to end on the smoke config: every stage runs, outputs and MLflow runs exist, a
second run has nothing to do, and a changed setting reruns exactly the jobs that read it.

The workflow runs once per module (the ``smoke`` fixture); each test checks one thing of it.
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import polars as pl
import pytest
import yaml
from hangs import run_until_stalled
from mlflow import MlflowClient

from rredcot.settings.reads import CREDIT_OF_ARM, READS

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
ARMS = [
    "bnpo",
    "dapo",
    "dr_grpo",
    "entropy",
    "entropy_mask",
    "exact",
    "grpo",
    "mc",
    "oracle",
    "prime",
    "rredcot",
    "rredcot_entropy",
    "spo",
]


# Credentials in the environment of every workflow run here, unique to this test session: a hub token
# and tracking credentials as a cluster job holds them. None may land in the results.
SECRETS = {
    name: f"{name.lower()}-{secrets.token_hex(16)}"
    for name in (
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "MLFLOW_TRACKING_USERNAME",
        "MLFLOW_TRACKING_PASSWORD",
        "MLFLOW_TRACKING_TOKEN",
    )
}


def _run(
    args: list[str], results: Path, overlay: Path | None = None, watched: bool = False
) -> subprocess.CompletedProcess:
    """Snakemake on the smoke config; ``watched``: a run that may take long, killed only when nothing
    under ``results`` and nothing in its output changes for a long while (tests/hangs.py)."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("RREDCOT_INVOCATION", None)
    env.update(SECRETS)  # scanned for in the smoke run's results (test_no_secret_in_results)
    configs = ["config/smoke.yaml", *([str(overlay)] if overlay else [])]
    cmd = [*SNAKEMAKE, "--configfile", *configs, "--config", f"results_dir={results}", *args]
    if watched:
        return run_until_stalled(cmd, watch=[results], cwd=ROOT, env=env)
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)


def _scheduled(proc: subprocess.CompletedProcess) -> dict[str, int]:
    """Rule -> job count from the job stats table of a dry run (exact rule names)."""
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = proc.stdout + proc.stderr
    if "Nothing to be done" in text:
        return {}
    lines = text[text.index("Job stats:") :].splitlines()[3:]  # after the title, header and rule
    table = lines[: next((i for i, line in enumerate(lines) if not line.strip()), len(lines))]
    rows = [line.split() for line in table]
    assert rows and all(len(row) == 2 and row[1].isdigit() for row in rows), table
    return {rule: int(count) for rule, count in rows if rule != "total"}


def test_bad_config_fails_before_any_job(tmp_path):
    proc = _run(["-n", "--config", f"results_dir={tmp_path}", "rl={'max_stepz': 1}"], tmp_path)
    assert proc.returncode != 0
    assert "max_stepz" in proc.stdout + proc.stderr


def test_a_setting_the_method_cannot_work_with_fails_before_any_job(tmp_path):
    overlay = tmp_path / "bad.yaml"
    overlay.write_text(yaml.safe_dump({"prompt": {"exit_string": ""}}))
    proc = _run(["-n"], tmp_path, overlay)
    assert proc.returncode != 0
    assert "prompt.exit_string: must not be empty" in proc.stdout + proc.stderr


def test_dry_run_lists_every_stage(tmp_path):
    jobs = _scheduled(_run(["-n"], tmp_path))
    runs = 2 * len(ARMS)  # every arm, two seeds; evaluation adds the base model's two seeds
    expected = {"data": 1, "clean": 1, "sft": 1, "train": runs, "evaluate": runs + 2}
    expected |= {"report": 1, "tables": 1}
    assert {rule: jobs.get(rule) for rule in expected} == expected
    studies = {r for r in READS if r.startswith("study_")} - OPTIONAL_STUDIES
    assert studies <= set(jobs) and not OPTIONAL_STUDIES & set(jobs)
    # analysis, prm and localisation traces; MC rollouts for the first two
    assert jobs["study_traces"] == 3 and jobs["study_mc"] == 2 and jobs["all"] == 1


# Studies that run only when a setting asks for them: the PRM study's fresh problems
# (studies.prm.analysis_problems).
OPTIONAL_STUDIES = {"study_problems"}
# Every study setting changed (but studies.prm.kind and studies.prm.analysis_problems, which pick the
# jobs), with the settings the studies share with other stages.
STUDY_SETTINGS = {
    "studies": {
        "n_traces": 6,
        "localisation_traces": 6,
        "seed": 3,
        "temperature": 0.9,
        "top_p": 0.9,
        "max_new_tokens": 40,
        "mc_samples": 3,
        "mc_max_new_tokens": 40,
        "bootstrap": 60,
        "backend": "vllm",
        "fidelity": {"traces": 5, "mc_samples": [1, 3]},
        "prm": {
            "name_or_path": "other/prm",
            "n_traces": 6,
            "epochs": 2,
            "batch_size": 8,
            "learning_rate": 0.0001,
            "weight_decay": 0.01,
            "val_fraction": 0.3,
            "label": "hard",
            "answer_hint": "plain",
        },
    },
    "threads": {"eval": 2, "train": 2},
    "model": {"dtype": "bfloat16"},
    "eval": {"vllm": {"gpu_memory_utilization": 0.8}},
    "credit": {"mix": 0.7, "budget": {"max_batch_tokens": 4096}},
    "prompt": {"exit_string": "\n</reasoning>\n", "answer_prefix": " \\answer{"},
}


def _leaves(tree: dict, prefix: str = "") -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    for key, value in tree.items():
        name = f"{prefix}{key}"
        out += _leaves(value, name + ".") if isinstance(value, dict) and value else [(name, value)]
    return out


def _study_commands(proc: subprocess.CompletedProcess) -> list[str]:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return sorted(set(re.findall(r"rredcot study-[^\n]*", proc.stdout + proc.stderr)))


def test_study_commands_carry_files_and_no_setting(tmp_path):
    """A study's settings reach it through the config file and its declared reads: with every
    study setting changed, each study job's command line is what it was."""
    defaults = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())["studies"]
    leaves = {key for key, _ in _leaves(defaults)}
    assert leaves - {"prm.kind", "prm.analysis_problems"} == {
        k for k, _ in _leaves(STUDY_SETTINGS["studies"])
    }
    overlay = tmp_path / "studies.yaml"
    overlay.write_text(yaml.safe_dump(STUDY_SETTINGS))
    before = _study_commands(_run(["-n", "-p", "all"], tmp_path))
    after = _study_commands(_run(["-n", "-p", "all"], tmp_path, overlay))
    studies = {r for r in READS if r.startswith("study_")} - OPTIONAL_STUDIES
    rules = {"study-" + r.removeprefix("study_").replace("_", "-") for r in studies}
    assert {c.split()[1] for c in before} == rules
    assert len(before) == 12  # three trace sets, two MC runs, and one job of every other study
    assert after == before


def test_the_prm_study_scores_fresh_problems_when_asked(tmp_path):
    """With studies.prm.analysis_problems the PRM study scores one trace each of the study split's
    fresh problems, drawn by a job of their own; the data the models use is not touched."""
    overlay = tmp_path / "prm.yaml"
    overlay.write_text(yaml.safe_dump({"studies": {"prm": {"analysis_problems": 8}}}))
    proc = _run(["-n", "-p", "all"], tmp_path, overlay)
    jobs = _scheduled(proc)
    assert jobs["study_problems"] == 1 and jobs["study_traces"] == 4 and jobs["data"] == 1
    text = proc.stdout + proc.stderr
    study = f"{tmp_path}/data/study.jsonl"
    assert re.search(rf"study-traces .*--set prm_analysis .*--data {re.escape(study)}", text)
    assert re.search(
        rf"study-prm .*--traces {re.escape(str(tmp_path))}/studies/prm_analysis/traces.jsonl", text
    )
    assert re.search(
        rf"study-attr-figures .*--prm {re.escape(str(tmp_path))}/studies/prm_analysis/prm.jsonl", text
    )


# ------------------------------------------------------------------------------------- one run
@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> Path:
    results = tmp_path_factory.mktemp("smoke") / "results"
    proc = _run(["--cores", "2", "all"], results, watched=True)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return results


@pytest.fixture(scope="module")
def train_runs(smoke: Path) -> list:
    client = MlflowClient(tracking_uri=f"sqlite:///{smoke}/mlflow.db")
    exp = client.get_experiment_by_name("rredcot-smoke")
    runs = client.search_runs([exp.experiment_id], max_results=500)
    return [r for r in runs if r.data.tags.get("rredcot.rule") == "train"]


@pytest.mark.slow
def test_table1_has_every_arm(smoke: Path) -> None:
    table = pl.read_csv(smoke / "table1.csv")
    labels = [
        "grpo",
        "rredcot",
        "entropy",
        "rredcot+entropy",
        "bnpo",
        "dr.grpo",
        "dapo",
        "oracle",
        "mc",
        "grpo_80/20",
    ]
    assert {"benchmark", "metric", "base_sft_mean", *(f"{a}_mean" for a in labels)} <= set(table.columns)
    assert set(table["grpo_seeds"].to_list()) == {2}
    assert "all" in table["benchmark"].to_list()


@pytest.mark.slow
def test_paired_comparison_with_the_first_arm(smoke: Path) -> None:
    paired = pl.read_csv(smoke / "paired.csv")
    # Every other arm against GRPO, then report.pairs (RREDCoT against MC); greedy and sampled each.
    assert set(paired["reference"].to_list()) == {"GRPO", "MC"}
    assert paired.height == 2 * (len(ARMS) - 1) + 2
    assert paired.filter(pl.col("reference") == "MC")["arm"].to_list() == ["RREDCoT", "RREDCoT"]
    assert set(paired["seeds"].to_list()) == {2} and (paired["diff_low"] <= paired["diff_high"]).all()
    # The same pairs against training compute, each from the seeds' own step times.
    compute = pl.read_csv(smoke / "compute.csv")
    assert compute.height == len(ARMS) and set(compute["seeds"].to_list()) == {2}
    assert (compute["arm_seconds"] > 0).all() and (compute["reference_seconds"] > 0).all()
    assert (compute["equal_compute_low"] <= compute["equal_compute_high"]).all()


@pytest.mark.slow
def test_claims_and_the_cost_of_monte_carlo_credit(smoke: Path) -> None:
    claims = pl.read_csv(smoke / "claims.csv")
    names = claims["claim"].to_list()
    assert {
        "rredcot_beats_grpo",
        "mc_beats_grpo",
        "rredcot_matches_mc",
        "rredcot_matches_mc_at_equal_compute",
        "cost",
        "testbed_exact_beats_grpo",
        "testbed_oracle_beats_grpo",
    } <= set(names)
    verdicts = dict(zip(names, claims["verdict"].to_list(), strict=True))
    cost_verdict = verdicts.pop("cost")
    assert set(verdicts.values()) <= {"supported", "contradicted", "too small to matter", "inconclusive"}
    assert cost_verdict in {"within the paper's range", "cheaper", "dearer"}
    text = (smoke / "claims.md").read_text()
    table = text[text.index("| claim |") :].split("\n\n")[0]
    assert table.count("\n| ") == len(names)  # a row per claim below the header
    power = text[text.index("## Power of the accuracy") : text.index("## Power of the correlations")]
    assert power.count("\n| ") == 1 + len(ARMS)  # the header, every arm but the reference, RREDCoT - MC
    # The smoke traces are too short for a late segment; the PRM's correlations are there.
    assert "| `prm_follows_thought_nll` |" in text[text.index("## Power of the correlations") :]
    cost = pl.read_csv(smoke / "cost.csv").filter(pl.col("kind") == "train")
    by_item = {r["item"]: r for r in cost.to_dicts()}
    # Monte Carlo credit counts what it generates for its values beside the policy's own completions:
    # nothing here, where no smoke trace has an advantage (test_credit_metrics_are_logged_every_step
    # checks that premise; tests/test_mc_credit.py sees it generate where traces have one).
    assert by_item["MC"]["rollout_tokens_per_step"] == 0 and by_item["MC"]["completion_tokens_per_step"] > 0
    assert by_item["GRPO"]["rollout_tokens_per_step"] is None
    assert by_item["GRPO"]["step_ratio_to_grpo"] == 1.0  # the reference is stock GRPO, not GRPO 80/20
    # PRIME's reward model is counted beside the policy; no other method keeps one.
    assert by_item["PRIME"]["extra_memory_gib"] > 0 and by_item["MC"]["extra_memory_gib"] is None
    # The methods side by side: a row per arm, each with the verdicts of the claims about it.
    methods = pl.read_csv(smoke / "methods.csv")
    assert sorted(methods["arm"].to_list()) == ARMS
    rows = {r["arm"]: r for r in methods.to_dicts()}
    assert rows["spo"]["claim_rredcot_at_equal_compute"] == "rredcot_vs_spo_at_equal_compute"
    assert rows["prime"]["verdict_vs_reference"] == verdicts["prime_beats_grpo"]
    assert "## Methods side by side" in text


@pytest.mark.slow
def test_figures_exist(smoke: Path) -> None:
    figures = smoke / "figures"
    assert (figures / "learning_curve.png").stat().st_size > 5000
    assert (figures / "learning_curve.pdf").exists()
    for name in (
        "fig3_truncation",
        "fig4_attribution_correlation",
        "fig5_prm_vs_nll",
        "fig6_prm_vs_rredcot",
        "fig7_mc_variance",
    ):
        for ext in ("png", "pdf"):
            assert (figures / f"{name}.{ext}").stat().st_size > 1000, name


@pytest.mark.slow
def test_localisation_summary(smoke: Path) -> None:
    localisation = json.loads((smoke / "studies" / "localisation" / "localisation.json").read_text())
    # The smoke model writes noise (no exit, no equations), so few or no traces have a culprit.
    assert localisation["all"]["traces"] == len(localisation["traces"])
    assert set(localisation) == {"all", "thinking", "answer", "traces"}


@pytest.mark.slow
def test_credit_fidelity(smoke: Path) -> None:
    """Every registered credit method scored against the exact values, Monte Carlo at each budget of
    the smoke config, with the figure and the claim row."""
    from rredcot import credit_methods

    table = pl.read_csv(smoke / "figures" / "fidelity_cost.csv")
    budgets = yaml.safe_load((ROOT / "config" / "smoke.yaml").read_text())["studies"]["fidelity"][
        "mc_samples"
    ]
    expected = {m for m in credit_methods() if m != "mc"} | {f"mc@{m}" for m in budgets}
    assert set(table["key"].to_list()) == expected
    assert (table["seconds_per_trace"] >= 0).all()
    summary = json.loads((smoke / "studies" / "analysis" / "fidelity.json").read_text())
    # Every method is scored, PRIME with a reward model trained online over the traces.
    assert summary["traces"] + len(summary["dropped"]) == 6 and not summary["skipped"]
    assert summary["costs"]["prime"]["updates"] >= 1
    assert (smoke / "figures" / "fidelity_cost.png").stat().st_size > 1000
    claims = pl.read_csv(smoke / "claims.csv")
    assert "testbed_rredcot_fidelity_beats_mc" in claims["claim"].to_list()


@pytest.mark.slow
def test_table2_and_cost(smoke: Path) -> None:
    table2 = pl.read_csv(smoke / "table2.csv")
    assert {"benchmark", "base_mean", "grpo_mean", "rredcot_mean", "paper_open_rs"} <= set(table2.columns)
    cost = pl.read_csv(smoke / "cost.csv")
    assert {"GRPO", "RREDCoT"} <= set(cost["item"].to_list()) and "study" in cost["kind"].to_list()
    items = cost["item"].to_list()
    within = dict(zip(items, cost["step_ratio_within_run"].to_list(), strict=True))
    credit_s = dict(zip(items, cost["credit_s_per_step"].to_list(), strict=True))
    # Uniform credit costs nothing and is the reference of the within-run ratio (RREDCoT's own cost
    # is not measurable here: its groups tie, so no trace needs credit; test_tables checks the ratios).
    assert within["GRPO"] == 1.0 and credit_s["GRPO"] == 0.0
    assert {"RREDCoT", "Entropy", "RREDCoT+Entropy", "BNPO", "Dr.GRPO", "DAPO"} <= set(within)


@pytest.mark.slow
def test_clean_report(smoke: Path) -> None:
    report = json.loads((smoke / "clean" / "report.json").read_text())
    assert report["flagged_fraction"] == pytest.approx(0.15)
    assert report["noise"]["precision"] == pytest.approx(1.0)
    assert report["noise"]["recall"] == pytest.approx(1.0)
    flags = (smoke / "clean" / "rl.flags.jsonl").read_text().splitlines()
    assert len(flags) == 200  # one flags row per RL row


@pytest.mark.slow
def test_logs_and_benchmarks(smoke: Path) -> None:
    for log in ("data", "clean", "sft", "report", "tables", "train/rredcot/seed0", "eval/base/seed0"):
        assert (smoke / "logs" / f"{log}.log").stat().st_size > 0, log
    assert (smoke / "benchmarks" / "sft.tsv").exists()
    assert (smoke / "benchmarks" / "train" / "grpo" / "seed1.tsv").exists()


@pytest.mark.slow
def test_no_secret_in_results(smoke: Path) -> None:
    """The hub token and tracking credentials the jobs had in their environment are nowhere in the
    results: not in the MLflow store (params, tags), artifacts, logs, journals or any other file
    (also not as the basic-auth header a request would carry)."""
    basic = f"{SECRETS['MLFLOW_TRACKING_USERNAME']}:{SECRETS['MLFLOW_TRACKING_PASSWORD']}"
    needles = {**SECRETS, "basic-auth header": base64.b64encode(basic.encode()).decode()}
    files = [path for path in smoke.rglob("*") if path.is_file()]
    assert smoke / "mlflow.db" in files and any(path.suffix == ".log" for path in files)
    found = []
    for path in files:
        content = path.read_bytes()
        hits = [name for name, value in needles.items() if value.encode() in content]
        found += [f"{name} in {path.relative_to(smoke)}" for name in hits]
    assert not found, found


@pytest.mark.slow
def test_one_mlflow_run_per_job(smoke: Path) -> None:
    # 1 data + 1 clean + 1 sft + arms x 2 train + (arms + base) x 2 eval + 1 report + 1 tables
    # + 1 claims + 3 trace sets, 2 MC runs, MC figures, attribution, PRM training and scoring, attribution
    # figures, blame localisation, credit fidelity.
    client = MlflowClient(tracking_uri=f"sqlite:///{smoke}/mlflow.db")
    exp = client.get_experiment_by_name("rredcot-smoke")
    runs = client.search_runs([exp.experiment_id], max_results=500)
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    parents = {r.data.tags["mlflow.parentRunId"] for r in children}
    runs = 2 * len(ARMS)
    assert len(children) == 3 + runs + (runs + 2) + 3 + 12 and len(parents) == 1
    assert all(r.info.status == "FINISHED" for r in children)


@pytest.mark.slow
def test_train_runs_are_tagged_and_logged(smoke: Path, train_runs: list) -> None:
    assert sorted((r.data.tags["rredcot.arm"], r.data.tags["rredcot.seed"]) for r in train_runs) == [
        (arm, seed) for arm in ARMS for seed in ("0", "1")
    ]
    kinds = {
        r.data.tags["rredcot.arm"]: (r.data.tags["rredcot.credit_method"], r.data.tags["rredcot.loss_type"])
        for r in train_runs
    }
    assert kinds["rredcot_entropy"] == ("rredcot+entropy", "grpo")
    assert kinds["dr_grpo"] == ("uniform", "dr_grpo")
    assert kinds["oracle"] == ("oracle", "grpo")
    client = MlflowClient(tracking_uri=f"sqlite:///{smoke}/mlflow.db")
    for run in train_runs:
        history = client.get_metric_history(run.info.run_id, "heldout_sampled_accuracy")
        assert [m.step for m in history] == [0, 1, 2]
        assert client.list_artifacts(run.info.run_id)
        assert "perf/step_seconds" in run.data.metrics


@pytest.mark.slow
def test_credit_metrics_are_logged_every_step(smoke: Path, train_runs: list) -> None:
    """Every credit-assigning step logs how many traces got credit and how long it took, also when
    none did: the smoke policy never earns a reward, so its groups tie and no trace needs credit.
    The same logging where credit runs on every step: test_trainer.py's
    test_credit_metrics_reach_mlflow_every_step."""
    client = MlflowClient(tracking_uri=f"sqlite:///{smoke}/mlflow.db")
    credited = [r for r in train_runs if r.data.tags["rredcot.arm"] in ("rredcot", "mc", "oracle")]
    assert len(credited) == 3 * 2, [r.data.tags["rredcot.arm"] for r in credited]  # 3 arms x 2 seeds
    for run in credited:
        history = {m: client.get_metric_history(run.info.run_id, m) for m in ("credit/traces", "reward")}
        assert [m.step for m in history["credit/traces"]] == [1, 2]
        assert [m.step for m in client.get_metric_history(run.info.run_id, "credit/seconds")] == [1, 2]
        assert [m.value for m in history["reward"]] == [0.0, 0.0]  # the premise: no reward, no credit
        assert [m.value for m in history["credit/traces"]] == [0.0, 0.0]


@pytest.mark.slow
def test_a_second_run_has_nothing_to_do(smoke: Path) -> None:
    assert _scheduled(_run(["--cores", "2", "all", "-n"], smoke)) == {}


# ------------------------------------------------------------------------- reruns follow reads
# One changed value for each setting a stage computes with (rredcot.settings.reads.READS); a key
# that names a whole section is represented by one setting in it.
CHANGES = {
    "data.synthetic.seed": 7,
    "clean.min_solution_steps": 3,
    "model.hidden_size": 48,
    "model.dtype": "bfloat16",
    "sft.learning_rate": 0.002,
    "prompt.template": "Q: {problem}\n<think>\n",
    "prompt.exit_string": "\n</reasoning>\n",
    "prompt.answer_prefix": " \\answer{",
    "prompt.answer_suffix": "}\n",
    "prompt.style": "template",
    "prompt.system_prompt": "Be brief.",
    "prompt.think_start": "<think>\n\n",
    "distributed.cpu_processes": 2,
    "arms.rredcot.credit_options": {"mix": 0.7},
    "rl.learning_rate": 0.0002,
    "rl.max_steps": 3,
    "rl.prompts_per_step": 4,
    "rl.num_generations": 2,
    "credit.mix": 0.7,
    "credit.mc.samples": 3,
    "credit.budget.max_batch_tokens": 4096,
    "eval.top_p": 0.9,
    "eval.n_samples": 3,
    "eval.temperature": 0.9,
    "eval.vllm.gpu_memory_utilization": 0.8,
    "rl.eval_problems": 6,
    "run_arms": ["grpo", "rredcot"],
    "report.table2_metric": "pass@2",
    "report.pairs": [["rredcot", "oracle"]],
    "studies.n_traces": 6,
    "studies.localisation_traces": 6,
    "studies.prm.n_traces": 6,
    "studies.max_new_tokens": 40,
    "studies.seed": 3,
    "studies.temperature": 0.9,
    "studies.top_p": 0.9,
    "studies.backend": "hf",
    "studies.mc_samples": 3,
    "studies.mc_max_new_tokens": 40,
    "studies.bootstrap": 60,
    "studies.fidelity.traces": 5,
    "studies.fidelity.mc_samples": [1, 3],
    "studies.prm.epochs": 2,
    "studies.prm.batch_size": 8,
    "studies.prm.learning_rate": 0.0001,
    "studies.prm.weight_decay": 0.01,
    "studies.prm.val_fraction": 0.3,
    "studies.prm.label": "hard",
    "studies.prm.answer_hint": "plain",
    "studies.prm.kind": "local",
    "studies.prm.name_or_path": "other/prm",
    "studies.prm.analysis_problems": 8,
}
# Settings that add jobs of their own to the DAG besides rerunning their readers.
ADDS_JOBS = {"studies.prm.analysis_problems": {"study_problems"}}
# Settings a stage reads that cannot change what it writes: changing them reruns nothing.
RUNS_ONLY = {
    "threads.train": 2,
    "threads.eval": 2,
    "rl.save_every": 2,
    "rl.resume": False,
    "sft.save_every": 20,
    "experiment": "rredcot-smoke-renamed",
    "distributed.main_process_port": 29600,
}
# Values equal to the smoke config's: the setting is read, but this value changes nothing.
SAME = {"studies.backend", "studies.prm.kind", "prompt.style"}


def _covers(declared: str, key: str) -> bool:
    return key == declared or key.startswith(declared + ".") or declared.startswith(key + ".")


def _any_arm(key: str) -> str:
    """A declared key, for whichever arm reads it (the smoke run trains the default arms, which
    between them read every credit setting)."""
    return "credit" if key == CREDIT_OF_ARM else key.replace("{arm}", "rredcot")


def _readers(key: str) -> set[str]:
    """Rules whose stage computes with ``key``."""
    out = set()
    for stage, reads in READS.items():
        keys = [*reads.computes, *(k for ks in reads.variants.values() for k in ks)]
        keys = [_any_arm(k) for k in keys]
        if any(_covers(k, key) for k in keys) and not any(_covers(k, key) and k != key for k in reads.runs):
            out.add(stage)
    return out


def _overlay(directory: Path, key: str, value) -> Path:
    """A config file that sets ``key`` (dotted) to ``value``; `--config` would pass nested values as
    strings."""
    tree = value
    for part in reversed(key.split(".")):
        tree = {part: tree}
    path = directory / f"change-{key}.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


@pytest.fixture(scope="module")
def downstream(smoke: Path) -> dict[str, set[str]]:
    """Rule -> every rule that consumes its outputs, directly or not (from the rule graph)."""
    proc = _run(["--rulegraph", "dot"], smoke)  # of the default target, all
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = dict(re.findall(r'^\s*(\d+)\[label = "([^"]+)"', proc.stdout, re.M))
    edges = [(names[a], names[b]) for a, b in re.findall(r"^\s*(\d+) -> (\d+)", proc.stdout, re.M)]
    closure: dict[str, set[str]] = {name: set() for name in names.values()}
    changed = True
    while changed:
        changed = False
        for a, b in edges:
            new = {b} | closure[b]
            if not new <= closure[a]:
                closure[a] |= new
                changed = True
    return closure


def test_every_declared_setting_has_a_change() -> None:
    # Not on the smoke DAG: the settings of real-data fetching and of the model rule (a GGUF source),
    # and data.kind, which picks the DAG (test_reads.py checks them on the settings side).
    declared = {
        _any_arm(k)
        for stage, reads in READS.items()
        if stage not in ("fetch", "model")
        for k in (*reads.computes, *(k for ks in reads.variants.values() for k in ks))
    } - {"data.kind"}
    missing = sorted(k for k in declared if not any(_covers(k, key) for key in CHANGES))
    assert not missing, f"add a value to CHANGES for {missing}"


@pytest.fixture(scope="module")
def dry_runs(smoke: Path) -> dict[str, subprocess.CompletedProcess]:
    """Setting -> the dry run of the smoke results with that setting changed (CHANGES, RUNS_ONLY).
    A dry run is one Python process that mostly imports and parses: two at a time use both cores.
    They only read the results (--nolock), so they can share them."""
    changes = {**{k: CHANGES[k] for k in set(CHANGES) - SAME}, **RUNS_ONLY}

    def dry(key: str) -> subprocess.CompletedProcess:
        return _run(["-n", "--nolock"], smoke, _overlay(smoke.parent, key, changes[key]))

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(changes, pool.map(dry, changes), strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("key", sorted(set(CHANGES) - SAME))
def test_changing_a_setting_reruns_its_readers_and_nothing_else(
    dry_runs: dict[str, subprocess.CompletedProcess], downstream: dict[str, set[str]], key: str
) -> None:
    jobs = _scheduled(dry_runs[key])
    readers = _readers(key) & set(downstream)
    assert readers, key
    affected = readers | {d for r in readers for d in downstream[r]}
    assert readers <= set(jobs), f"{key}: {sorted(readers - set(jobs))} not rerun"
    added = ADDS_JOBS.get(key, set())
    assert added <= set(jobs), f"{key}: {sorted(added - set(jobs))} not run"
    assert set(jobs) <= affected | added | {"all"}, (
        f"{key}: {sorted(set(jobs) - affected)} rerun without reading it"
    )


@pytest.mark.slow
def test_a_credit_setting_reruns_the_arms_whose_method_reads_it(
    dry_runs: dict[str, subprocess.CompletedProcess],
) -> None:
    """The Monte Carlo rollouts: only the MC arm trains again (one job per seed), and with it only
    its evaluations; the GRPO, RREDCoT and oracle runs stand."""
    assert CHANGES["credit.mc.samples"] == 3
    jobs = _scheduled(dry_runs["credit.mc.samples"])
    seeds = len(yaml.safe_load((ROOT / "config" / "smoke.yaml").read_text())["seeds"])
    assert jobs["train"] == jobs["evaluate"] == seeds


@pytest.mark.slow
@pytest.mark.parametrize("key", sorted(RUNS_ONLY))
def test_changing_a_run_setting_reruns_nothing(
    dry_runs: dict[str, subprocess.CompletedProcess], key: str
) -> None:
    assert _scheduled(dry_runs[key]) == {}
