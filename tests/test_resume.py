"""Training resumes after a crash: checkpoints, the continued MLflow run, outputs that appear whole.

The slow tests kill real training jobs with SIGKILL (``rredcot train`` and ``rredcot sft`` processes,
and a Snakemake run during its train job) as soon as a checkpoint is complete, then run the same
command again.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from datasets import Dataset
from hangs import HANG_SECONDS
from jobs import CONFIGS, ROOT, check_resumed, job_env, kill_when_saved, make_base, train_runs, write_config
from mlflow import MlflowClient
from transformers import TrainerCallback

from rredcot.adapter.experiment import grpo_args
from rredcot.adapter.trainer import RREDCoTTrainer
from rredcot.data.records import rl_records
from rredcot.infra.io import write_json, write_jsonl
from rredcot.infra.resume import (
    LOGGED_TAG,
    Resume,
    RunLogger,
    fingerprint,
    latest_checkpoint,
    prepare,
    record,
)
from rredcot.infra.tracking import INVOCATION_ENV, JobRun, job_run, tracking_uri
from rredcot.settings.config import load_config

MAX_STEPS = 12
SAVE_EVERY = 2


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_base(tmp_path_factory.mktemp("base"))


def _write_config(path: Path, results: Path) -> Path:
    return write_config(path, results, MAX_STEPS, SAVE_EVERY)


def _check_resumed(results: Path, out: Path, run_id: str, resumed: int, log: str) -> None:
    check_resumed(results, out, run_id, resumed, log, MAX_STEPS)


# ------------------------------------------------------------------------------------- unit tests
def _fake_checkpoint(directory: Path, step: int, max_steps: int, text: str | None = None) -> Path:
    path = directory / f"checkpoint-{step}"
    path.mkdir(parents=True)
    state = {"global_step": step, "max_steps": max_steps}
    (path / "trainer_state.json").write_text(json.dumps(state) if text is None else text)
    return path


def test_latest_checkpoint_skips_cut_short_and_final_ones(tmp_path: Path) -> None:
    good = _fake_checkpoint(tmp_path, 2, 8)
    _fake_checkpoint(tmp_path, 4, 8, text='{"global_st')  # killed while writing the state
    (tmp_path / "checkpoint-5").mkdir()  # killed before writing the state
    _fake_checkpoint(tmp_path, 8, 8)  # the last step: resuming there would take a step too many
    assert latest_checkpoint(tmp_path) == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-2"]


def test_prepare_keeps_only_checkpoints_of_the_same_job(tmp_path: Path) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text("{}\n")
    digest = fingerprint({"lr": 0.1}, [data])
    assert fingerprint({"lr": 0.2}, [data]) != digest
    ckpts = tmp_path / "ckpt"
    assert prepare(ckpts, digest, True, "test") == Resume()  # nothing there yet

    record(ckpts, digest, "run123")
    good = _fake_checkpoint(ckpts, 3, 10)
    assert prepare(ckpts, digest, True, "test") == Resume(good, "run123")
    assert Resume(good, "run123").tags == {"rredcot.resumed_from": "checkpoint-3"}

    os.utime(data, ns=(0, 0))  # the input changed (as Snakemake sees it): start over
    changed = fingerprint({"lr": 0.1}, [data])
    assert changed != digest
    assert prepare(ckpts, changed, True, "test") == Resume()
    assert not ckpts.exists()

    write_json(ckpts / "job.json", {"fingerprint": digest, "mlflow_run_id": "x"})
    assert prepare(ckpts, digest, False, "test") == Resume()  # resume: false
    assert not ckpts.exists()


# A job that logs one step and dies without any cleanup, as under SIGKILL: its run stays RUNNING.
KILLED_JOB = """
import os, sys
from rredcot.infra.tracking import job_run

run = job_run("job", results_dir=sys.argv[1], experiment="exp", rule="train", params={"rl": {"lr": 1}})
first = run.__enter__()
first.log_metrics({"loss": 1.0}, step=1)
print(first.run_id, flush=True)
os._exit(0)
"""


def test_job_run_continues_the_run_of_a_killed_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {**job_env(), INVOCATION_ENV: "inv-1"}
    killed = subprocess.run([sys.executable, "-c", KILLED_JOB, str(tmp_path)], env=env, capture_output=True)
    assert killed.returncode == 0, killed.stderr[-2000:]
    first = killed.stdout.decode().split()[-1]
    client = MlflowClient(tracking_uri(tmp_path))
    assert client.get_run(first).info.status == "RUNNING"

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv(INVOCATION_ENV, "inv-2")
    kw = {"results_dir": tmp_path, "experiment": "exp", "rule": "train"}
    with job_run("job", **kw, params={"rl": {"lr": 1, "new": 2}}, resume=first) as again:
        again.log_metrics({"loss": 0.5}, step=2)
    run = client.get_run(first)
    assert again.run_id == first and run.info.status == "FINISHED"
    tags = run.data.tags
    assert tags["rredcot.attempt"] == "2" and tags["rredcot.invocation"] == "inv-2"
    assert tags["rredcot.previous_invocation"] == "inv-1"
    assert run.data.params == {"rl.lr": "1", "rl.new": "2"}
    assert [m.step for m in client.get_metric_history(first, "loss")] == [1, 2]
    where = "tags.`rredcot.kind` = 'invocation'"
    parents = {
        r.data.tags["rredcot.invocation"]: r for r in client.search_runs([run.info.experiment_id], where)
    }
    assert tags["mlflow.parentRunId"] == parents["inv-2"].info.run_id
    assert {r.info.status for r in parents.values()} == {"FINISHED"}  # the killed one's parent too

    client.delete_run(first)  # a run that is gone can't continue: a new one links to it
    with job_run("job", **kw, resume=first) as linked:
        pass
    assert linked.run_id != first
    assert client.get_run(linked.run_id).data.tags["rredcot.previous_run"] == first


class _Killed(BaseException):
    """A SIGKILL, in-process: nothing after it runs (no cleanup, no retry)."""


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> MlflowClient:
    return MlflowClient(f"sqlite:///{tmp_path_factory.mktemp('store')}/mlflow.db")


@pytest.mark.parametrize("from_checkpoint", [True, False], ids=["resumed", "started-over"])
@pytest.mark.parametrize("kill", ["before-flush", "metrics-without-tag", "after-flush"])
def test_each_step_reaches_mlflow_once_whenever_the_kill_comes(
    store: MlflowClient, kill: str, from_checkpoint: bool
) -> None:
    """A job is killed around the flush that follows its checkpoint at step 2, then runs again.

    ``metrics-without-tag``: MLflow's SQL store commits a batch's metrics and its tags separately;
    a kill between the two left steps in the run that the tag didn't count, and the resumed job
    logged them again (steps 0, 0, 1, 1, 2, 2, ... under load)."""
    run = JobRun(store, store.create_run(store.create_experiment(f"{kill}-{from_checkpoint}")).info.run_id)

    def state(step: int, saved: dict | None = None) -> SimpleNamespace:
        return SimpleNamespace(global_step=step, stateful_callbacks=saved or {})

    def values(step: int) -> dict[str, float]:
        return {"loss": step / 10, "acc@1": 1 / (step + 1)}  # "acc@1" is acc_at_1 in MLflow

    first = RunLogger(run, hold=True)
    first.on_train_begin(None, state(0), None)
    for step in range(3):
        first.log(values(step), step)
    saved = json.loads(json.dumps({"RunLogger": first.state()}))  # checkpoint-2's trainer_state.json

    def log_batch(run_id: str, metrics: list, tags: list = ()) -> None:
        MlflowClient.log_batch(store, run_id, metrics=metrics)  # committed ...
        if tags:
            raise _Killed  # ... and the kill comes before the tag is

    with pytest.MonkeyPatch.context() as patch, contextlib.suppress(_Killed):
        if kill == "metrics-without-tag":
            patch.setattr(store, "log_batch", log_batch)
        if kill != "before-flush":
            first.on_save(None, state(2), None)
    assert store.get_run(run.run_id).data.tags.get(LOGGED_TAG) == ("2" if kill == "after-flush" else None)

    # The next attempt, from checkpoint-2 or from scratch (no usable checkpoint), goes on to step 4.
    again = RunLogger(JobRun(store, run.run_id), hold=True)
    again.on_train_begin(None, state(2, saved) if from_checkpoint else state(0), None)
    for step in range(3 if from_checkpoint else 0, 5):
        again.log(values(step), step)
    again.on_save(None, state(4), None)
    for key, name in (("loss", "loss"), ("acc@1", "acc_at_1")):
        history = store.get_metric_history(run.run_id, name)
        assert sorted(m.step for m in history) == list(range(5)), key  # each step exactly once
        assert {m.step: m.value for m in history} == {step: values(step)[key] for step in range(5)}
    assert store.get_run(run.run_id).data.tags[LOGGED_TAG] == "4"


# -------------------------------------------------------------------------------- real kill tests
@pytest.mark.slow
def test_killed_train_job_resumes_from_its_last_checkpoint(base: Path, tmp_path: Path) -> None:
    results, out = tmp_path / "results", tmp_path / "out"
    cfg = _write_config(tmp_path / "cfg.yaml", results)
    ckpts = results / "checkpoints" / "train" / "grpo" / "seed0"
    cmd = [
        *(sys.executable, "-m", "rredcot.stages.train", "--config", *CONFIGS, str(cfg), "--arm", "grpo"),
        *("--seed", "0", "--model", str(base / "model"), "--data", str(base / "rl.jsonl")),
        *("--eval-data", str(base / "test.jsonl"), "--out", str(out)),
    ]
    with open(tmp_path / "first.log", "w") as log:
        proc = subprocess.Popen(
            cmd, env=job_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        kill_when_saved(proc, ckpts / f"checkpoint-{SAVE_EVERY}")
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "model").exists() and not (out / "curve.csv").exists()  # nothing looks finished
    run_id = json.loads((ckpts / "job.json").read_text())["mlflow_run_id"]
    assert train_runs(results)[0].info.status == "RUNNING"  # as a SIGKILL leaves it

    again = subprocess.run(cmd, env=job_env(), capture_output=True, text=True, timeout=HANG_SECONDS)
    log = again.stdout + again.stderr
    assert again.returncode == 0, log[-3000:]
    resumed = int(re.search(r"resuming from checkpoint-(\d+)", log).group(1))
    assert SAVE_EVERY <= resumed < MAX_STEPS and resumed % SAVE_EVERY == 0
    _check_resumed(results, out, run_id, resumed, log)
    assert not ckpts.exists()  # the finished job's checkpoints are gone


@pytest.mark.slow
def test_killed_sft_job_resumes_to_the_same_model(base: Path, tmp_path: Path) -> None:
    def command(name: str) -> tuple[Path, list[str]]:
        results = tmp_path / name
        cfg = tmp_path / f"{name}.yaml"
        cfg.write_text(yaml.safe_dump({"results_dir": str(results), "sft": {"epochs": 3, "save_every": 2}}))
        out = results / "models" / "sft"
        return results, [
            *(sys.executable, "-m", "rredcot.stages.sft", "--config", *CONFIGS, str(cfg)),
            *("--data", str(base / "sft.jsonl"), "--out", str(out)),
        ]

    straight, cmd = command("straight")
    subprocess.run(cmd, env=job_env(), check=True, capture_output=True, timeout=HANG_SECONDS)
    results, cmd = command("killed")
    with open(tmp_path / "first.log", "w") as log:
        proc = subprocess.Popen(
            cmd, env=job_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        kill_when_saved(proc, results / "checkpoints" / "sft" / "checkpoint-2")
    assert not (results / "models" / "sft").exists()
    again = subprocess.run(cmd, env=job_env(), capture_output=True, text=True, timeout=HANG_SECONDS)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "[sft] resuming from checkpoint-" in again.stdout + again.stderr

    # The same tokenizer and, bit for bit, the same weights as without the kill.
    for name in ("tokenizer.json", "model.safetensors"):
        assert (results / "models" / "sft" / name).read_bytes() == (
            straight / "models" / "sft" / name
        ).read_bytes()
    client = MlflowClient(tracking_uri(results))
    exp = client.get_experiment_by_name("rredcot-smoke")
    runs = client.search_runs([exp.experiment_id], "tags.`rredcot.rule` = 'sft'")
    assert (
        len(runs) == 1 and runs[0].info.status == "FINISHED" and runs[0].data.tags["rredcot.attempt"] == "2"
    )


class _Crash(TrainerCallback):
    def on_step_end(self, args, state, control, **kw):  # noqa: ANN001
        if state.global_step == 3:
            raise RuntimeError("crash")


def _dense_reward(completions: list[str], **_: object) -> list[float]:
    """Varies between completions, so that a random model gets non-zero advantages and learns."""
    return [1.0 / (1 + len(c)) for c in completions]


def test_resumed_training_equals_uninterrupted_training(base: Path, tmp_path: Path) -> None:
    """Weights, optimizer, RNG and data position come back: resumed GRPO is bit for bit the same."""
    cfg = load_config(CONFIGS, {"rl": {"max_steps": 4, "save_every": 2, "max_completion_length": 24}})
    from rredcot.lm.modeling import load_model, load_tokenizer

    tok, start = load_tokenizer(base / "model"), load_model(base / "model", "float32")
    dataset = Dataset.from_list(rl_records([json.loads(x) for x in open(base / "rl.jsonl")], "{problem}"))

    def trainer(out: Path, *callbacks: TrainerCallback) -> RREDCoTTrainer:
        torch.manual_seed(0)
        return RREDCoTTrainer(
            model=copy.deepcopy(start),
            reward_funcs=[_dense_reward],
            args=grpo_args(cfg, "grpo", 0, out),
            train_dataset=dataset,
            processing_class=tok,
            callbacks=list(callbacks),
        )

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the pipeline's jobs run; also faster on a shared CPU
    try:
        straight = trainer(tmp_path / "straight")
        straight.train()
        crashed = trainer(tmp_path / "crashed", _Crash())
        with pytest.raises(RuntimeError, match="crash"):
            crashed.train()
        resumed = trainer(tmp_path / "crashed")
        resumed.train(resume_from_checkpoint=str(latest_checkpoint(tmp_path / "crashed")))
    finally:
        torch.set_num_threads(threads)
    assert resumed.state.global_step == 4
    changed = False
    for (name, a), b, s in zip(
        straight.model.named_parameters(), resumed.model.parameters(), start.parameters(), strict=True
    ):
        assert torch.equal(a, b), name
        changed |= not torch.equal(a, s)
    assert changed  # the test is not vacuous: training moved the weights


@pytest.mark.slow
def test_killed_snakemake_run_resumes_its_train_job(base: Path, tmp_path: Path) -> None:
    """Kill the whole workflow during a train job; ``--rerun-incomplete`` resumes that job."""
    results = tmp_path / "results"
    # The upstream outputs, oldest first, so that Snakemake has only the train job to run.
    for name in ("sft", "rl", "test"):
        write_jsonl(results / "data" / f"{name}.jsonl", [json.loads(x) for x in open(base / f"{name}.jsonl")])
    write_jsonl(results / "data" / "rl.clean.jsonl", [json.loads(x) for x in open(base / "rl.jsonl")])
    write_jsonl(results / "clean" / "rl.flags.jsonl", [])
    write_json(results / "clean" / "report.json", {})
    time.sleep(0.01)
    shutil.copytree(base / "model", results / "models" / "sft")
    os.utime(results / "models" / "sft")  # copytree gave it the old folder's mtime
    # Snakemake keeps its state in ./.snakemake: run from a folder of our own, not the repository.
    work = tmp_path / "work"
    work.mkdir()
    for name in ("workflow", "config", "envs"):
        (work / name).symlink_to(ROOT / name)
    cfg = _write_config(tmp_path / "cfg.yaml", results)
    target = results / "train" / "grpo" / "seed0" / "curve.csv"
    snakemake = [sys.executable, "-m", "snakemake", "--configfile", "config/smoke.yaml", str(cfg)]
    cmd = [*snakemake, "--cores", "1", "--rerun-incomplete", "--", str(target)]
    ckpts = results / "checkpoints" / "train" / "grpo" / "seed0"
    with open(tmp_path / "first.log", "w") as log:
        proc = subprocess.Popen(
            cmd, cwd=work, env=job_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        kill_when_saved(proc, ckpts / f"checkpoint-{SAVE_EVERY}")
    first = (tmp_path / "first.log").read_text()
    assert "rule train:" in first and "rule sft:" not in first  # only the train job was to run
    assert not target.exists()
    run_id = json.loads((ckpts / "job.json").read_text())["mlflow_run_id"]

    # A SIGKILLed Snakemake leaves its lock behind; it names only our files, so unlocking is ours to do.
    unlock = subprocess.run([*snakemake, "--unlock"], cwd=work, env=job_env(), capture_output=True, text=True)
    assert unlock.returncode == 0, unlock.stderr[-2000:]
    again = subprocess.run(cmd, cwd=work, env=job_env(), capture_output=True, text=True, timeout=HANG_SECONDS)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "1 of 1 steps (100%) done" in again.stdout + again.stderr  # only the train job ran
    log = (results / "logs" / "train" / "grpo" / "seed0.log").read_text()
    resumed = int(re.search(r"resuming from checkpoint-(\d+)", log).group(1))
    _check_resumed(results, target.parent, run_id, resumed, log)
