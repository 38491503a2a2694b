"""Training resumes after a crash: checkpoints, the continued MLflow run, outputs that appear whole.

The slow tests kill real training jobs with SIGKILL (``rredcot train`` and ``rredcot sft`` processes,
and a Snakemake run during its train job) as soon as a checkpoint is complete, then run the same
command again.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
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
from rredcot.infra.journal import deliver_pending
from rredcot.infra.resume import (
    LOGGED_TAG,
    SEAL_FILE,
    Preempted,
    Resume,
    RunLogger,
    StopOnSignal,
    check_checkpoint,
    fingerprint,
    latest_checkpoint,
    prepare,
    record,
    seal_checkpoint,
    stop_on_signal,
)
from rredcot.infra.stopping import PREEMPTED_EXIT
from rredcot.infra.tracking import (
    INVOCATION_ENV,
    JobRun,
    deliver_record,
    job_run,
    start_journal,
    tracking_uri,
)
from rredcot.settings.config import Tracking, load_config

MAX_STEPS = 12
SAVE_EVERY = 2
TIMEOUTS = dataclasses.asdict(Tracking())  # job_run without a config: the config's default timeouts


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
    if text is None:  # a whole state: the save went through
        seal_checkpoint(path)
    return path


def test_latest_checkpoint_skips_cut_short_and_final_ones(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    good = _fake_checkpoint(tmp_path, 2, 8)
    _fake_checkpoint(tmp_path, 4, 8, text='{"global_st')  # killed while writing the state
    (tmp_path / "checkpoint-5").mkdir()  # killed before writing the state
    (_fake_checkpoint(tmp_path, 6, 8) / SEAL_FILE).unlink()  # as written before checkpoints were sealed
    _fake_checkpoint(tmp_path, 8, 8)  # the last step: resuming there would take a step too many
    with caplog.at_level(logging.INFO, logger="rredcot.infra.resume"):
        assert latest_checkpoint(tmp_path) == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-2"]
    unsealed = f"in {tmp_path}: it has no {SEAL_FILE}: its save did not finish (or it predates sealed"
    skipped = {r.getMessage().split(" ")[1]: r for r in caplog.records}
    assert list(skipped) == ["checkpoint-8", "checkpoint-6", "checkpoint-5", "checkpoint-4"]
    assert skipped["checkpoint-8"].levelno == logging.INFO  # the normal end of a job, not a fault
    for name in ("checkpoint-6", "checkpoint-5", "checkpoint-4"):
        assert skipped[name].levelno == logging.WARNING and unsealed in skipped[name].getMessage(), name


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


# A job that logs one step and dies without any cleanup, as under SIGKILL: its run stays RUNNING, and
# the step may still be in its journal only (the rerun continues the journal and delivers it).
KILLED_JOB = """
import os, sys
from rredcot.infra.tracking import job_run

run = job_run("job", results_dir=sys.argv[1], experiment="exp", rule="train", params={"rl": {"lr": 1}},
              **TIMEOUTS)
first = run.__enter__()
first.log_metrics({"loss": 1.0}, step=1)
print(first.run_id, first.journal_id, flush=True)
os._exit(0)
""".replace("TIMEOUTS", repr(TIMEOUTS))


def test_job_run_continues_the_run_of_a_killed_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {**job_env(), INVOCATION_ENV: "inv-1"}
    killed = subprocess.run([sys.executable, "-c", KILLED_JOB, str(tmp_path)], env=env, capture_output=True)
    assert killed.returncode == 0, killed.stderr[-2000:]
    first, journal = killed.stdout.decode().split()[-2:]
    client = MlflowClient(tracking_uri(tmp_path))
    assert client.get_run(first).info.status == "RUNNING"

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv(INVOCATION_ENV, "inv-2")
    kw = {"results_dir": tmp_path, "experiment": "exp", "rule": "train", **TIMEOUTS}
    with job_run("job", **kw, params={"rl": {"lr": 1, "new": 2}}, resume=first, journal=journal) as again:
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


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results dir with a (migrated) sqlite store, shared by the tests (each has its experiment)."""
    results = tmp_path_factory.mktemp("store")
    MlflowClient(tracking_uri(results))
    return results


@pytest.mark.parametrize("from_checkpoint", [True, False], ids=["resumed", "started-over"])
@pytest.mark.parametrize("kill", ["before-flush", "flush-cut-short", "after-flush"])
def test_each_step_reaches_mlflow_once_whenever_the_kill_comes(
    store: Path, kill: str, from_checkpoint: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job is killed around the flush that follows its checkpoint at step 2, then runs again: it
    continues the killed attempt's journal and learns from it, not from the store, which steps the
    run has. The store is reached only afterwards, as after an outage: resuming needs none.

    ``flush-cut-short``: the kill comes while the flush's record is written, so the journal's last
    line is torn; the rerun cuts it off and logs those steps again."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv(INVOCATION_ENV, "inv-kill")
    kw = {"results_dir": store, "experiment": f"{kill}-{from_checkpoint}", "rule": "train"}
    journal = start_journal("job", **kw)

    def state(step: int, saved: dict | None = None) -> SimpleNamespace:
        return SimpleNamespace(global_step=step, stateful_callbacks=saved or {})

    def values(step: int) -> dict[str, float]:
        return {"loss": step / 10, "acc@1": 1 / (step + 1)}  # "acc@1" is acc_at_1 in MLflow

    first = RunLogger(JobRun(journal), hold=True)
    first.on_train_begin(None, state(0), None)
    for step in range(3):
        first.log(values(step), step)
    saved = json.loads(json.dumps({"RunLogger": first.state()}))  # checkpoint-2's trainer_state.json
    if kill != "before-flush":
        first.flush()  # what on_save does once the checkpoint is saved
    journal.close()  # the kill
    if kill == "flush-cut-short":
        os.truncate(journal.path, journal.path.stat().st_size - 5)

    # The next attempt, from checkpoint-2 or from scratch (no usable checkpoint), goes on to step 4.
    rerun = start_journal("job", **kw, journal=journal.id)
    assert rerun.id == journal.id
    again = RunLogger(JobRun(rerun), hold=True)
    again.on_train_begin(None, state(2, saved) if from_checkpoint else state(0), None)
    for step in range(3 if from_checkpoint else 0, 5):
        again.log(values(step), step)
    again.flush()
    rerun.close()
    assert deliver_pending(rerun, deliver_record) == len(rerun.records())

    client = MlflowClient(tracking_uri(store))
    run_id = rerun.state()["run_id"]
    for key, name in (("loss", "loss"), ("acc@1", "acc_at_1")):
        history = client.get_metric_history(run_id, name)
        assert sorted(m.step for m in history) == list(range(5)), key  # each step exactly once
        assert {m.step: m.value for m in history} == {step: values(step)[key] for step in range(5)}
    run = client.get_run(run_id)
    assert run.data.tags[LOGGED_TAG] == "4" and run.data.tags["rredcot.attempt"] == "2"


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


def test_a_stop_signal_stops_training_after_its_step_but_not_at_the_last() -> None:
    """Real signals to this process: noted, not fatal, acted on at the step's end (save and stop);
    a second one changes nothing; the handlers before the block come back after it."""
    from transformers import TrainerControl

    before = signal.getsignal(signal.SIGTERM)
    with stop_on_signal(save=True) as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGUSR1)  # a second signal, as SLURM may send during the save
        time.sleep(0.01)  # Python runs the handlers between bytecodes of the main thread
    assert signal.getsignal(signal.SIGTERM) == before and stop.signum == signal.SIGTERM
    control = TrainerControl()
    stop.on_step_end(None, SimpleNamespace(global_step=3, max_steps=4), control)
    assert control.should_save and control.should_training_stop and stop.stopped_at == 3
    with pytest.raises(Preempted) as stopped:
        stop.check()
    assert stopped.value.code == PREEMPTED_EXIT
    assert str(stopped.value).startswith("stopped on SIGTERM at step 3")

    last = StopOnSignal(save=True)
    last.received(signal.SIGTERM)
    control = TrainerControl()
    last.on_step_end(None, SimpleNamespace(global_step=4, max_steps=4), control)
    assert not control.should_save and last.stopped_at is None  # the job ends normally instead
    last.check()


def _signal_after_step(proc: subprocess.Popen, metrics: Path, step: int, signum: int) -> None:
    """Send ``signum`` to ``proc`` once its ``metrics.jsonl`` has the loss of ``step``: that step has
    ended (its metrics are logged after its callbacks), so the job stops at the next one."""
    t0 = time.monotonic()
    while True:
        assert proc.poll() is None, f"the job ended (rc {proc.returncode}) before step {step}"
        assert time.monotonic() - t0 < HANG_SECONDS, f"step {step} not reached in {HANG_SECONDS} s"
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        if any(json.loads(x)["step"] >= step and "loss" in x for x in lines if x.endswith("}")):
            break
        time.sleep(0.02)
    proc.send_signal(signum)


@pytest.mark.slow
def test_signalled_train_job_saves_and_resumes_to_the_same_weights(base: Path, tmp_path: Path) -> None:
    """SLURM's signal before preemption (SIGTERM) reaches a train job between periodic checkpoints:
    the job finishes its step, saves a checkpoint there, ends its MLflow run KILLED, writes no output
    and exits 75; the rerun resumes at that step and ends with an uninterrupted run's weights."""
    steps, save_every = 4, 3  # a periodic save at step 3 only: the signal comes at step 2

    def command(name: str) -> tuple[Path, Path, list[str]]:
        results, out = tmp_path / name, tmp_path / name / "out"
        cfg = write_config(tmp_path / f"{name}.yaml", results, steps, save_every)
        return (
            results,
            out,
            [
                *(
                    "rredcot",
                    "launch",
                    "train",
                    "--config",
                    *CONFIGS,
                    str(cfg),
                    "--arm",
                    "grpo",
                    "--seed",
                    "0",
                ),
                *("--model", str(base / "model"), "--data", str(base / "rl.jsonl")),
                *("--eval-data", str(base / "test.jsonl"), "--out", str(out)),
            ],
        )

    _, straight_out, straight_cmd = command("straight")
    results, out, cmd = command("signalled")
    ckpts = results / "checkpoints" / "train" / "grpo" / "seed0"
    with open(tmp_path / "straight.log", "w") as straight_log, open(tmp_path / "first.log", "w") as log:
        # The uninterrupted reference runs meanwhile: one thread each, they share the CPUs.
        straight = subprocess.Popen(
            straight_cmd, env=job_env(), stdout=straight_log, stderr=subprocess.STDOUT
        )
        proc = subprocess.Popen(cmd, env=job_env(), stdout=log, stderr=subprocess.STDOUT)
        try:
            _signal_after_step(proc, out / "metrics.jsonl", 1, signal.SIGTERM)
            proc.wait(timeout=HANG_SECONDS)
            straight.wait(timeout=HANG_SECONDS)
        finally:
            for job in (proc, straight):
                if job.poll() is None:
                    job.kill()
    assert straight.returncode == 0, (tmp_path / "straight.log").read_text()[-3000:]
    first = (tmp_path / "first.log").read_text()
    assert proc.returncode == PREEMPTED_EXIT, first[-3000:]
    assert "stopped on SIGTERM at step 2" in first, first[-3000:]
    assert sorted(p.name for p in ckpts.glob("checkpoint-*")) == ["checkpoint-2"]
    assert not (out / "model").exists() and not (out / "curve.csv").exists()  # the job is to be rerun
    (run,) = train_runs(results)
    assert run.info.status == "KILLED"

    again = subprocess.run(cmd, env=job_env(), capture_output=True, text=True, timeout=HANG_SECONDS)
    log = again.stdout + again.stderr
    assert again.returncode == 0, log[-3000:]
    check_resumed(results, out, run.info.run_id, 2, log, steps)  # each step once, in MLflow too
    for name in ("model.safetensors", "config.json"):  # bit for bit what the uninterrupted run made
        assert (out / "model" / name).read_bytes() == (straight_out / "model" / name).read_bytes(), name
    assert not ckpts.exists()


class _Crash(TrainerCallback):
    """Fails the Trainer's save of step 3 after the checkpoint is written and the rotation has deleted
    the oldest one, but before the checkpoint is sealed: a kill at the worst moment of a save."""

    def on_save(self, args, state, control, **kw):  # noqa: ANN001
        if state.global_step == 3:
            raise RuntimeError("crash")


def _dense_reward(completions: list[str], **_: object) -> list[float]:
    """Varies between completions, so that a random model gets non-zero advantages and learns."""
    return [1.0 / (1 + len(c)) for c in completions]


@pytest.fixture(scope="module")
def grpo(base: Path, tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """Tiny GRPO runs of 4 steps, in process: ``straight`` (uninterrupted), then one that saves every
    step and crashes in its save of step 3 (:class:`_Crash`; its checkpoint folder as it left it is
    ``crashed``), then ``resumed`` from that folder's newest complete checkpoint. ``start`` is the
    model they all start from."""
    short = {"max_steps": 4, "max_completion_length": 24}
    cfg = load_config(CONFIGS, {"rl": {**short, "save_every": 2}})
    every_step = load_config(CONFIGS, {"rl": {**short, "save_every": 1}})
    from rredcot.lm.modeling import load_model, load_tokenizer

    tok, start = load_tokenizer(base / "model"), load_model(base / "model", "float32")
    dataset = Dataset.from_list(rl_records([json.loads(x) for x in open(base / "rl.jsonl")], "{problem}"))

    def trainer(settings: dict, out: Path, *callbacks: TrainerCallback) -> RREDCoTTrainer:
        torch.manual_seed(0)
        return RREDCoTTrainer(
            model=copy.deepcopy(start),
            reward_funcs=[_dense_reward],
            args=grpo_args(settings, "grpo", 0, out),
            train_dataset=dataset,
            processing_class=tok,
            callbacks=[*callbacks, RunLogger(None, hold=False)],  # as a job's: it seals each save
        )

    root = tmp_path_factory.mktemp("grpo")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the pipeline's jobs run; also faster on a shared CPU
    try:
        straight = trainer(cfg, root / "straight")
        straight.train()
        crashed = trainer(every_step, root / "run", _Crash())
        with pytest.raises(RuntimeError, match="crash"):
            crashed.train()
        shutil.copytree(root / "run", root / "crashed")
        resumed = trainer(cfg, root / "run")
        resumed.train(resume_from_checkpoint=str(latest_checkpoint(root / "run")))
    finally:
        torch.set_num_threads(threads)
    return SimpleNamespace(start=start, straight=straight, resumed=resumed, crashed=root / "crashed")


def test_resumed_training_equals_uninterrupted_training(grpo: SimpleNamespace) -> None:
    """Weights, optimizer, RNG and data position come back: resumed GRPO is bit for bit the same."""
    assert grpo.resumed.state.global_step == 4
    changed = False
    for (name, a), b, s in zip(
        grpo.straight.model.named_parameters(),
        grpo.resumed.model.parameters(),
        grpo.start.parameters(),
        strict=True,
    ):
        assert torch.equal(a, b), name
        changed |= not torch.equal(a, s)
    assert changed  # the test is not vacuous: training moved the weights


def _checkpoints(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("checkpoint-*"))


def _resume_from(folder: Path, caplog: pytest.LogCaptureFixture) -> Path | None:
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="rredcot.infra.resume"):
        return latest_checkpoint(folder)


def test_a_save_cut_short_before_its_seal_is_not_resumed(
    grpo: SimpleNamespace, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The Trainer deletes old checkpoints (rotation) inside its save, before the new one is sealed:
    the crash there left the sealed checkpoint-2 beside the unsealed checkpoint-3, and resuming
    takes checkpoint-2 and says why it skipped checkpoint-3 (which the resumed run above did)."""
    assert _checkpoints(grpo.crashed) == ["checkpoint-2", "checkpoint-3"]  # checkpoint-1 rotated away
    assert check_checkpoint(grpo.crashed / "checkpoint-2") is None
    folder = shutil.copytree(grpo.crashed, tmp_path / "crashed")
    assert _resume_from(folder, caplog) == folder / "checkpoint-2"
    assert f"skipping checkpoint-3 in {folder}: it has no {SEAL_FILE}" in caplog.text
    assert _checkpoints(folder) == ["checkpoint-2"]  # never kept by a later rotation instead of it


def test_each_file_cut_short_makes_resume_take_the_checkpoint_before(
    grpo: SimpleNamespace, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A newest checkpoint sealed as the Trainer's save seals it, then, on a fresh copy each time, one
    of its files cut to half its size (each file in turn, the seal too) or removed: resuming takes
    the complete checkpoint before it and names the skipped one, the file and both sizes. Intact,
    the newest is taken."""
    sealed = shutil.copytree(grpo.crashed, tmp_path / "sealed")
    sizes = seal_checkpoint(sealed / "checkpoint-3")
    covered = {"model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"}
    assert covered <= set(sizes), sizes  # weights, optimizer, schedule, RNG and state
    assert _resume_from(shutil.copytree(sealed, tmp_path / "intact"), caplog).name == "checkpoint-3"
    assert not caplog.records

    def torn(case: str, cut: object) -> str:
        folder = shutil.copytree(sealed, tmp_path / case)
        cut(folder / "checkpoint-3")
        picked = _resume_from(folder, caplog)
        assert picked == folder / "checkpoint-2", f"{case}: resumed from {picked}"
        assert _checkpoints(folder) == ["checkpoint-2"], case
        return caplog.text.replace(f" in {folder}:", ":")

    for i, (name, size) in enumerate(sorted(sizes.items())):
        assert size > 0, f"{name} is empty: cutting it short can't be tested"
        log = torn(f"cut{i}", lambda ckpt, name=name, size=size: os.truncate(ckpt / name, size // 2))
        assert f"skipping checkpoint-3: {name} has {size // 2} bytes, sealed with {size}" in log, name
    log = torn("seal", lambda ckpt: os.truncate(ckpt / SEAL_FILE, (ckpt / SEAL_FILE).stat().st_size // 2))
    assert f"skipping checkpoint-3: its {SEAL_FILE} is unreadable (JSONDecodeError" in log
    log = torn("removed", lambda ckpt: (ckpt / "optimizer.pt").unlink())
    missing = f"optimizer.pt is missing (sealed with {sizes['optimizer.pt']} bytes)"
    assert f"skipping checkpoint-3: {missing}" in log


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
