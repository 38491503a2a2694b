"""Tracking never costs a job: a tracking server that goes away during a job, or is away when it
starts, and the delivery of the job's journal afterwards (``rredcot tracking sync``).

The server tests run a real ``rredcot tracking server`` on a free local port and stop it (SIGTERM to
its process group); one of them stops it in the middle of a real train job. After the server is back
and ``sync`` has run, the store must hold exactly what the journal holds: every metric value once,
every param, tag and artifact. The unit tests deliver journals to a sqlite store.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from hangs import HANG_SECONDS
from jobs import CONFIGS, job_env, make_base, write_config
from mlflow import MlflowClient
from tracking_server import stop_server

from rredcot.infra.journal import Journal, deliver_pending, journals
from rredcot.infra.resume import is_resumable
from rredcot.infra.tracking import (
    INVOCATION_ENV,
    JOURNAL_TAG,
    JobRun,
    deliver_record,
    job_run,
    start_journal,
    tracking_uri,
)
from rredcot.settings.config import Tracking
from rredcot.tools.launch import free_port
from rredcot.tools.tracking import main

RREDCOT = Path(sys.executable).parent / "rredcot"
MAX_STEPS, SAVE_EVERY = 4, 2


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated, empty MLflow database: spares each server start the schema migrations."""
    root = tmp_path_factory.mktemp("template")
    MlflowClient(f"sqlite:///{root}/mlflow.db")
    return root / "mlflow.db"


def start_server(results: Path, port: int, template: Path) -> subprocess.Popen:
    """``rredcot tracking server`` on ``port`` with its store in ``results``, once it answers."""
    results.mkdir(exist_ok=True)
    if not (results / "mlflow.db").exists():
        shutil.copy(template, results / "mlflow.db")
    log = (results / "server.log").open("a")
    cmd = [RREDCOT, "tracking", "server", "--results-dir", results, "--port", str(port)]
    # Its own process group, so that stopping it stops the server's worker processes too.
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + HANG_SECONDS
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                if response.status == 200:
                    return proc
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_server(proc)
            pytest.fail(f"the tracking server did not start:\n{(results / 'server.log').read_text()[-3000:]}")
        time.sleep(0.2)


def check_store_equals_journal(client: MlflowClient, journal: Journal, tmp: Path) -> None:
    """The journal is delivered, and its run holds each of its metric values exactly once, its params,
    tags, artifacts (as they were when logged) and its end status."""
    assert journal.pending() == [], "records left undelivered"
    records = journal.records()
    run_id = journal.state()["run_id"]
    run = client.get_run(run_id)
    assert run.data.tags[JOURNAL_TAG] == journal.id
    found = client.search_runs([run.info.experiment_id], f"tags.`{JOURNAL_TAG}` = '{journal.id}'")
    assert [r.info.run_id for r in found] == [run_id]  # one run, never a second one

    # The store keys a metric value by (key, timestamp, step, value), so two equal values logged in one
    # millisecond are one row (TRL logs `epoch` at the last step and again in its train summary). A
    # value delivered twice would be a second row only with a new timestamp, which the journal lacks.
    logged = Counter(
        {
            (key, step, value, t)
            for r in records
            if r["op"] == "metrics"
            for key, value, t, step in r["metrics"]
        }
    )
    stored = Counter(
        (key, m.step, m.value, m.timestamp)
        for key in run.data.metrics
        for m in client.get_metric_history(run_id, key)
    )
    assert stored == logged, "the store's metric values differ from the journal's"  # none twice

    params = {k: v for r in records if r["op"] == "params" for k, v in r["params"].items()}
    assert run.data.params == params
    tags = {k: v for r in records if r["op"] in ("start", "tags", "metrics") for k, v in r["tags"].items()}
    assert tags.items() <= run.data.tags.items()

    for i, r in enumerate(r for r in records if r["op"] in ("artifact", "artifacts")):
        kept = journal.kept(r.get("file") or r["dir"])
        files = [kept] if kept.is_file() else sorted(p for p in kept.rglob("*") if p.is_file())
        for file in files:
            name = file.name if kept.is_file() else str(file.relative_to(kept))
            path = f"{r['artifact_path']}/{name}" if r["artifact_path"] else name
            local = client.download_artifacts(run_id, path, str(tmp / f"artifact{i}"))
            assert Path(local).read_bytes() == file.read_bytes(), path
    (end,) = [r for r in records if r["op"] == "end"]
    assert run.info.status == end["status"]
    assert client.get_run(run.data.tags["mlflow.parentRunId"]).info.status == "FINISHED"


def test_the_job_timeouts_are_the_configs() -> None:
    """``job_run`` has no timeouts of its own: its caller passes the config's (``stage_run``) or the
    config's defaults (``Tracking``), so each default is written once."""
    params = inspect.signature(job_run).parameters
    for name in (f.name for f in dataclasses.fields(Tracking)):
        assert params[name].default is inspect.Parameter.empty, name


# ------------------------------------------------------------------------------------- unit tests
def test_a_torn_last_record_is_ignored_then_cut_off(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A job killed while writing a record leaves the journal's last line without its newline."""
    journal = Journal(tmp_path / "job.jsonl").open()
    journal.append({"op": "tags", "tags": {"a": "1"}})
    journal.append({"op": "tags", "tags": {"b": "2"}})
    journal.close()
    with journal.path.open("ab") as fh:
        fh.write(b'{"op":"metrics","metr')  # the kill
    with caplog.at_level(logging.WARNING):
        assert [r["tags"] for r in Journal(journal.path).records()] == [{"a": "1"}, {"b": "2"}]
    assert "cut short" in caplog.text

    again = Journal(journal.path).open()  # a rerun continues the journal: the torn bytes go first
    again.append({"op": "tags", "tags": {"c": "3"}})
    again.close()
    lines = journal.path.read_text().splitlines()
    assert [json.loads(line)["tags"] for line in lines] == [{"a": "1"}, {"b": "2"}, {"c": "3"}]

    journal.path.write_text(lines[0] + "\n{broken\n" + lines[1] + "\n")  # not a kill: never skipped
    with pytest.raises(ValueError, match="broken record"):
        Journal(journal.path).records()


def test_a_password_in_the_tracking_uri_stays_out_of_the_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://jobs:s3cret@127.0.0.1:5077")
    journal = start_journal("job", results_dir=tmp_path, experiment="faults", rule="train")
    journal.close()
    assert journal.records()[0]["uri"] == "http://127.0.0.1:5077"
    assert b"s3cret" not in journal.path.read_bytes()


class _Crash(Exception):
    """A delivery cut short after the store took a record and before the state was saved."""


def _log_a_job(results: Path, name: str) -> Journal:
    """A job's journal, as a job writes it (without delivering): every kind of record."""
    journal = start_journal(
        name, results_dir=results, experiment="faults", rule="train", seed=3, tags={"x": 1}
    )
    run = JobRun(journal)
    run.log_params({"rl": {"lr": 0.1, "steps": 4}})
    for step in range(1, 5):
        run.log_metrics({"loss": 1 / step, "acc@1": step / 4}, step=step)
    run.log_steps([(5, {"loss": 0.1}), (6, {"loss": 0.05})], {"rredcot.logged_step": 6})
    run.set_tags({"note": "hi"})
    (results / "out.txt").write_text("as logged")
    run.log_artifact(results / "out.txt", "outputs")
    (results / "out.txt").write_text("changed after logging")
    (results / "folder" / "sub").mkdir(parents=True)
    (results / "folder" / "sub" / "a.json").write_text("{}")
    run.log_artifacts(results / "folder", "credit")
    journal.append({"op": "end", "status": "FINISHED", "time": int(time.time() * 1000)})
    journal.close()
    return journal


@pytest.fixture
def sqlite_env(monkeypatch: pytest.MonkeyPatch, template: Path, tmp_path: Path) -> None:
    """The local sqlite store in ``tmp_path`` (already migrated), and a fixed invocation id."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv(INVOCATION_ENV, "inv-faults")
    shutil.copy(template, tmp_path / "mlflow.db")


def test_redelivery_after_a_crash_at_every_record_adds_nothing(tmp_path: Path, sqlite_env: None) -> None:
    """Each record reaches the store, then delivery dies before saving its state, and goes on: every
    record is delivered twice (creating the run included), and the store has each thing once."""
    journal = _log_a_job(tmp_path, "crashy")
    calls: Counter[int] = Counter()

    def deliver_then_crash(journal: Journal, record: dict, state: dict) -> None:
        deliver_record(journal, record, state)
        calls[state["delivered"]] += 1
        if calls[state["delivered"]] == 1:
            raise _Crash

    while journal.pending():
        with contextlib.suppress(_Crash):
            deliver_pending(journal, deliver_then_crash)
    assert list(calls.values()) == [2] * len(journal.records())
    client = MlflowClient(tracking_uri(tmp_path))
    check_store_equals_journal(client, journal, tmp_path)
    assert client.get_metric_history(journal.state()["run_id"], "acc_at_1")[-1].value == 1.0


def test_sync_skips_a_journal_a_running_job_holds(
    tmp_path: Path, sqlite_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    held = start_journal("running", results_dir=tmp_path, experiment="faults", rule="train")
    JobRun(held).log_metrics({"loss": 1.0}, step=1)
    done = _log_a_job(tmp_path, "done")
    assert main(["sync", "--results-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"{held.id}: skipped, a running job holds it (2 records (1 metric values, 0 artifacts)" in out
    assert f"{done.id}: delivered 11 records (10 metric values, 2 artifacts) to run" in out
    check_store_equals_journal(MlflowClient(tracking_uri(tmp_path)), done, tmp_path)

    held.close()  # the job is gone (the kernel drops its lock however it ends)
    assert main(["sync", "--results-dir", str(tmp_path)]) == 0
    assert f"{held.id}: delivered 2 records" in capsys.readouterr().out
    assert main(["sync", "--results-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == ""  # nothing is pending: nothing is sent


# ----------------------------------------------------------------------------------- server tests
# A job that logs while its tracking server is away from the start; its user set one MLflow HTTP
# setting, which the job must keep.
OFFLINE_JOB = """
import os, sys, time
from pathlib import Path
from rredcot.infra.tracking import job_run

results = Path(sys.argv[1])
t0 = time.monotonic()
with job_run("offline", results_dir=results, experiment="faults", rule="evaluate", seed=1,
             params={"eval": {"n": 50}}, tags={"extra": "x"}, flush_timeout_s=1,
             request_timeout_s=REQUEST_TIMEOUT_S) as run:
    started = time.monotonic() - t0
    for step in range(50):
        run.log_metrics({"loss": 1 / (step + 1), "acc@1": step / 50}, step=step)
    out = results / "summary.json"
    out.write_text("as logged")
    run.log_artifact(out, "outputs")
    out.write_text("changed after logging")
    run.set_tags({"note": "done"})
    steps = time.monotonic() - t0 - started
print(f"started {started:.1f}s logged {steps:.3f}s", os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"],
      os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"])
""".replace("REQUEST_TIMEOUT_S", repr(Tracking().request_timeout_s))  # the config's default


def test_a_job_started_while_the_server_is_down_runs_and_sync_delivers(
    template: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    results = tmp_path / "job"
    env = {**job_env(), "MLFLOW_TRACKING_URI": uri, "MLFLOW_HTTP_REQUEST_TIMEOUT": "7"}
    job = subprocess.run(
        [sys.executable, "-c", OFFLINE_JOB, str(results)], env=env, capture_output=True, text=True,
        timeout=HANG_SECONDS,
    )  # fmt: skip
    assert job.returncode == 0, job.stderr[-3000:]
    print(job.stdout.strip())
    assert job.stdout.split()[-2:] == ["2", "7"]  # MLflow's retries cut; the user's timeout kept
    assert job.stderr.count("does not answer") == 1, job.stderr  # one warning, not one per call
    assert "55 records (100 metric values, 1 artifacts) are pending" in job.stderr, job.stderr
    assert f"rredcot tracking sync --results-dir {results}" in job.stderr
    (journal,) = journals(results)
    assert journal.state().get("run_id") is None and not (results / "mlflow.db").exists()

    server = start_server(tmp_path / "server", port, template)
    try:
        assert main(["sync", "--results-dir", str(results)]) == 0
        delivered = f"{journal.id}: delivered 55 records (100 metric values, 1 artifacts)"
        assert delivered in capsys.readouterr().out
        client = MlflowClient(uri)
        check_store_equals_journal(client, journal, tmp_path)
        run = client.get_run(journal.state()["run_id"])
        assert run.data.tags["extra"] == "x" and run.data.tags["rredcot.seed"] == "1"
        history = client.get_metric_history(run.info.run_id, "acc_at_1")
        assert sorted(m.step for m in history) == list(range(50))
        assert main(["sync", "--results-dir", str(results)]) == 0
        assert capsys.readouterr().out == ""  # nothing is sent twice
    finally:
        stop_server(server)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_base(tmp_path_factory.mktemp("base"))


def test_a_train_job_outlives_its_tracking_server(
    base: Path, template: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The server is stopped once the job's first checkpoint is saved (its steps so far delivered);
    the job trains on, writes its outputs and exits 0; the rest reaches MLflow by ``sync``."""
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    server = start_server(tmp_path / "server", port, template)
    results, out = tmp_path / "results", tmp_path / "out"
    cfg = write_config(tmp_path / "cfg.yaml", results, MAX_STEPS, SAVE_EVERY, tracking={"flush_timeout_s": 2})
    ckpts = results / "checkpoints" / "train" / "grpo" / "seed0"
    cmd = [
        *(sys.executable, "-m", "rredcot.stages.train", "--config", *CONFIGS, str(cfg), "--arm", "grpo"),
        *("--seed", "0", "--model", str(base / "model"), "--data", str(base / "rl.jsonl")),
        *("--eval-data", str(base / "test.jsonl"), "--out", str(out)),
    ]
    try:
        with open(tmp_path / "job.log", "w") as log:
            proc = subprocess.Popen(
                cmd, env={**job_env(), "MLFLOW_TRACKING_URI": uri}, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
            t0 = time.monotonic()
            deadline = t0 + HANG_SECONDS
            while not is_resumable(ckpts / f"checkpoint-{SAVE_EVERY}"):
                assert proc.poll() is None, (tmp_path / "job.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "no checkpoint"
                time.sleep(0.02)
            print(f"server stopped {time.monotonic() - t0:.1f}s after the job started")
            stop_server(server)
            stopped = time.monotonic()
            assert proc.wait(timeout=HANG_SECONDS) == 0, (tmp_path / "job.log").read_text()[-3000:]
        print(f"job ended {time.monotonic() - stopped:.1f}s after the server stopped")
        text = (tmp_path / "job.log").read_text()
        assert (out / "model" / "model.safetensors").exists() and (out / "curve.csv").exists()
        steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert max(steps) == MAX_STEPS
        # At most one outage warning (the job may end before MLflow's own retries give up).
        assert text.count("does not answer") <= 1, text[-3000:]
        assert f"deliver them with: rredcot tracking sync --results-dir {results}" in text
        (journal,) = journals(results)
        left = len(journal.pending())
        assert left > 0

        server = start_server(tmp_path / "server", port, template)
        sync = subprocess.run(
            [RREDCOT, "tracking", "sync", "--results-dir", results], env=job_env(), capture_output=True,
            text=True, timeout=HANG_SECONDS,
        )  # fmt: skip
        assert sync.returncode == 0, sync.stdout + sync.stderr[-3000:]
        assert f"{journal.id}: delivered {left} records" in sync.stdout
        client = MlflowClient(uri)
        check_store_equals_journal(client, journal, tmp_path)
        run_id = journal.state()["run_id"]
        history = client.get_metric_history(run_id, "loss")
        assert sorted(m.step for m in history) == list(range(1, MAX_STEPS + 1))
        names = {a.path for a in client.list_artifacts(run_id)}
        assert {"curve.csv", "metrics.jsonl"} <= names
        capsys.readouterr()
        assert main(["sync", "--results-dir", str(results)]) == 0
        assert capsys.readouterr().out == ""  # nothing is sent twice
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        stop_server(server)
