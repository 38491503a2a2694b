"""Tests for MLflow job tracking against a real sqlite store and a real local ``mlflow server``."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import mlflow
import pytest
from hangs import HANG_SECONDS
from mlflow import MlflowClient
from mlflow.entities import ViewType
from tracking_server import stop_server

from rredcot.infra.tracking import (
    INVOCATION_ENV,
    MAX_PARAM_VAL_LENGTH,
    flatten_params,
    invocation_id,
    job_run,
    retry,
    tracking_uri,
)
from rredcot.settings.config import Tracking
from rredcot.tools.launch import free_port
from rredcot.tools.tracking import main, runs_url, runs_view_tag

STEPS = 30
TIMEOUTS = dataclasses.asdict(Tracking())  # job_run without a config: the config's default timeouts
# A job process: signal readiness, wait for the common start signal (so that all processes hit the
# fresh store at the same moment), then log params, a metric history and an artifact.
WORKER = """
import sys, time
from pathlib import Path
from rredcot.infra.tracking import job_run

results, i, go = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
(go.parent / f"ready-{i}").touch()
while not go.exists():
    time.sleep(0.01)
params = {"opt": {"lr": 0.001, "betas": [0.9, 0.99]}, "job": i}
with job_run(f"job-{i}", results_dir=results, experiment="exp", rule="train_grpo",
             arm=f"arm{i % 2}", seed=i, params=params, tags={"extra": "x"}, **TIMEOUTS) as run:
    for step in range(STEPS):
        run.log_metrics({"loss": 1.0 / (step + 1), "nan": float("nan"), "text": "n/a"}, step=step)
    out = results / f"out-{i}.txt"
    out.write_text(str(i))
    run.log_artifact(out, "outputs")
""".replace("STEPS", str(STEPS)).replace("TIMEOUTS", repr(TIMEOUTS))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One results dir shared by the in-process tests (each uses its own experiment), since creating a
    fresh MLflow database runs all schema migrations, which takes seconds. A pristine copy of the migrated
    database is kept as ``template.db`` for the tracking-server test."""
    results = tmp_path_factory.mktemp("results")
    MlflowClient(f"sqlite:///{results}/mlflow.db")
    shutil.copy(results / "mlflow.db", results.parent / "template.db")
    return results


@pytest.fixture
def sqlite_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Environment without a tracking server, with a fixed invocation id (also set for this process)."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv(INVOCATION_ENV, "inv-test")
    return dict(os.environ)


def run_workers(
    n: int,
    results: Path,
    env: dict[str, str],
    before_go: Callable[[], None] = lambda: None,
    timeout: float = HANG_SECONDS,
) -> None:
    """Start ``n`` job processes, release them together once all have imported MLflow and ``before_go``
    returned, and require that all succeed (a wait of ``timeout`` seconds only bounds a hang)."""
    gate = results.parent / "gate"
    gate.mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(results), str(i), str(gate / "go")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(n)
    ]
    try:
        deadline = time.monotonic() + timeout
        while len(list(gate.glob("ready-*"))) < n and time.monotonic() < deadline:
            if any(p.poll() is not None for p in procs):
                break  # a worker died early: report below
            time.sleep(0.05)
        before_go()
        (gate / "go").touch()
        deadline = time.monotonic() + timeout
        outputs = [p.communicate(timeout=max(1, deadline - time.monotonic()))[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, out in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out


def check_invocation(client: MlflowClient, n: int, invocation: str) -> None:
    """Exactly one parent and ``n`` finished children with full histories, tags, params, artifacts."""
    exp = client.get_experiment_by_name("exp")
    where = f"tags.`rredcot.invocation` = '{invocation}' and tags.`rredcot.kind` = "
    parents = client.search_runs([exp.experiment_id], where + "'invocation'")
    children = client.search_runs([exp.experiment_id], where + "'job'")
    assert len(parents) == 1
    assert parents[0].info.status == "FINISHED"
    assert sorted(r.info.run_name for r in children) == [f"job-{i}" for i in range(n)]
    for run in children:
        i = int(run.info.run_name.split("-")[1])
        assert run.info.status == "FINISHED"
        tags = run.data.tags
        assert tags["mlflow.parentRunId"] == parents[0].info.run_id
        assert tags.pop("rredcot.journal").startswith(f"job-{i}-")  # the job's journal (its delivery)
        ours = {k: v for k, v in tags.items() if k.startswith("rredcot.") or k == "extra"}
        assert ours == {
            "rredcot.rule": "train_grpo",
            "rredcot.arm": f"arm{i % 2}",
            "rredcot.seed": str(i),
            "rredcot.invocation": invocation,
            "rredcot.kind": "job",
            "extra": "x",
        }
        assert run.data.params == {"opt.lr": "0.001", "opt.betas": "[0.9, 0.99]", "job": str(i)}
        assert set(run.data.metrics) == {"loss"}  # NaN and text were skipped, not logged or fatal
        history = client.get_metric_history(run.info.run_id, "loss")
        assert sorted(m.step for m in history) == list(range(STEPS))
        assert [a.path for a in client.list_artifacts(run.info.run_id, "outputs")] == [f"outputs/out-{i}.txt"]


def test_concurrent_jobs_on_fresh_sqlite_store(tmp_path: Path, sqlite_env: dict[str, str]) -> None:
    results = tmp_path / "results"
    run_workers(4, results, sqlite_env)

    uri = tracking_uri(results)
    assert uri == f"sqlite:///{results.resolve()}/mlflow.db"
    client = MlflowClient(uri)
    check_invocation(client, 4, "inv-test")
    # Artifacts live in results_dir, not in ./mlartifacts of whatever the working directory was.
    exp = client.get_experiment_by_name("exp")
    assert exp.artifact_location == (results.resolve() / "mlartifacts" / "exp").as_uri()
    # Marked as a model-training experiment (MLflow's kind for runs, as opposed to GenAI traces).
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    assert len(list((results / "mlartifacts" / "exp").glob("*/artifacts/outputs/out-*.txt"))) == 4


def test_failure_marks_run_failed_and_propagates(store: Path, sqlite_env: dict[str, str]) -> None:
    with job_run("ok", results_dir=store, experiment="failure", rule="sft", **TIMEOUTS) as ok:
        ok.log_metrics({"acc": 0.5})
    with pytest.raises(RuntimeError, match="boom"):
        with job_run(
            "bad", results_dir=store, experiment="failure", rule="sft", params={"x": 1}, **TIMEOUTS
        ) as bad:
            bad.log_metrics({"loss": 1.0}, step=0)
            raise RuntimeError("boom")

    client = MlflowClient(tracking_uri(store))
    assert client.get_run(ok.run_id).info.status == "FINISHED"
    failed = client.get_run(bad.run_id)
    assert failed.info.status == "FAILED" and failed.data.metrics == {"loss": 1.0}
    # Both jobs of the invocation share one parent, which ends when its last job ends.
    parent_id = failed.data.tags["mlflow.parentRunId"]
    assert client.get_run(ok.run_id).data.tags["mlflow.parentRunId"] == parent_id
    assert client.get_run(parent_id).info.status == "FINISHED"


def test_job_run_ignores_fluent_active_run(store: Path, sqlite_env: dict[str, str]) -> None:
    """A library that opens its own fluent run (as trainers' MLflow callbacks do) can't hijack our logging."""
    mlflow.set_tracking_uri(tracking_uri(store))
    try:
        with mlflow.start_run() as foreign:
            with job_run("job", results_dir=store, experiment="fluent", rule="grpo", **TIMEOUTS) as run:
                run.log_metrics({"reward": 0.25}, step=3)
                run.log_params({"a": {"b": {"c": 1}}})
                run.set_tags({"note": "hi"})
                mlflow.log_metric("foreign_metric", 1.0)
    finally:
        mlflow.set_tracking_uri(None)
    client = MlflowClient(tracking_uri(store))
    ours = client.get_run(run.run_id)
    assert ours.data.metrics == {"reward": 0.25} and ours.data.params == {"a.b.c": "1"}
    assert ours.data.tags["note"] == "hi"
    assert client.get_run(foreign.info.run_id).data.metrics == {"foreign_metric": 1.0}


def test_retry_outlasts_a_real_sqlite_lock(tmp_path: Path) -> None:
    db = tmp_path / "x.db"
    holder = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN EXCLUSIVE")  # like another job in the middle of a write
    writer = sqlite3.connect(db, timeout=0)  # no busy wait: fails at once while the lock is held
    with pytest.raises(sqlite3.OperationalError, match="database is locked"):
        writer.execute("INSERT INTO t VALUES (1)")
    release = threading.Timer(0.5, holder.execute, ["COMMIT"])
    attempts = []

    def execute(sql: str) -> sqlite3.Cursor:
        attempts.append(sql)
        try:
            return writer.execute(sql)
        finally:
            if release.ident is None:  # the lock goes only after a first attempt met it, however slow
                release.start()

    retry(execute, "INSERT INTO t VALUES (2)")
    writer.commit()
    assert len(attempts) > 1  # it waited for the lock and tried again instead of failing
    assert writer.execute("SELECT x FROM t").fetchall() == [(2,)]
    release.join()

    # Errors that waiting can't fix are raised at once, without a second attempt.
    attempts.clear()
    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        retry(execute, "SELECT * FROM missing")
    assert attempts == ["SELECT * FROM missing"]


def test_uri_invocation_and_params(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:1")
    assert tracking_uri(tmp_path) == "http://127.0.0.1:1"  # a configured server wins
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert tracking_uri(tmp_path / "new") == f"sqlite:///{(tmp_path / 'new').resolve()}/mlflow.db"
    assert (tmp_path / "new").is_dir()

    monkeypatch.delenv(INVOCATION_ENV, raising=False)
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{6}", invocation_id())
    monkeypatch.setenv(INVOCATION_ENV, "abc")
    assert invocation_id() == "abc"
    monkeypatch.setenv(INVOCATION_ENV, "x' or '1'='1")
    with pytest.raises(ValueError, match=INVOCATION_ENV):
        with job_run("j", results_dir=tmp_path, experiment="e", rule="r", **TIMEOUTS):
            pass

    flat = flatten_params({"a": {"b": {"c": 1}, "d": None}, "e": {}, "long": "x" * 10_000})
    assert flat == {"a.b.c": "1", "a.d": "None", "e": "{}", "long": "x" * MAX_PARAM_VAL_LENGTH}


def test_flatten_params_redacts_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    """A token in params (a free-form part of the config, a URL, a stage's arguments), under a key
    that names a secret or as the environment's hub token or tracking password, is never logged."""
    monkeypatch.setenv("HF_TOKEN", "hf_environment_token_1234")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "tracking-password-5678")
    spec = {"path": "gsm8k", "token": "hf_in_config", "hub_token": "x" * 12}
    spec["storage_options"] = {"api_key": 1}
    flat = flatten_params(
        {
            "data": {"train": spec, "url": "https://u:tracking-password-5678@host/x"},
            "args": ["--token", "hf_environment_token_1234"],
            "eval": {"max_new_tokens": 64, "pad_token_id": 0, "secret_sauce": "kept"},
        }
    )
    assert flat == {
        "data.train.path": "gsm8k",
        "data.train.token": "[redacted]",
        "data.train.hub_token": "[redacted]",
        "data.train.storage_options.api_key": "[redacted]",
        "data.url": "[redacted]",
        "args": "[redacted]",
        "eval.max_new_tokens": "64",
        "eval.pad_token_id": "0",
        "eval.secret_sauce": "kept",
    }


def test_cli(store: Path, sqlite_env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    missing = store.parent / "no-results"
    assert main(["runs", "--results-dir", str(missing)]) == 1  # no database: say so, create none
    assert not (missing / "mlflow.db").exists()
    with job_run(
        "eval-s1", results_dir=store, experiment="cli", rule="evaluate", arm="base", seed=1, **TIMEOUTS
    ) as run:
        run.log_metrics({"acc": 0.5, "f1": 0.25})
    capsys.readouterr()
    assert main(["runs", "--results-dir", str(store), "--experiment", "cli"]) == 0
    table = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert table[0] == ["experiment", "run", "rule", "arm", "seed", "status", "#metrics"]
    assert table[1:] == [
        ["cli", "eval-s1", "evaluate", "base", "1", "FINISHED", "2"],
        ["cli", "invocation-inv-test", "(invocation)", "FINISHED", "0"],
    ]
    assert main(["ui", "--results-dir", str(store), "--print-only"]) == 0
    out = capsys.readouterr().out
    assert f"mlflow ui --backend-store-uri {tracking_uri(store)}" in out
    # The link to the experiment's runs, and the saved view it names, stored on the experiment.
    exp = MlflowClient(tracking_uri(store)).get_experiment_by_name("cli")
    assert f"experiment cli: open {runs_url('http://127.0.0.1:5000', exp.experiment_id)}" in out
    key, _ = runs_view_tag()
    view = json.loads(exp.tags[key])
    assert view["name"] == "Runs by invocation"
    group_by = json.loads(view["state"])["groupBy"]
    assert group_by["groupByKeys"] == [{"mode": "tag", "groupByData": "rredcot.invocation"}]
    assert "experiment Default" not in out  # no workflow runs there


def test_runs_url() -> None:
    # The runs page of MLflow 3.17's UI (model-training pages), in the saved view of the runs.
    assert runs_url("http://127.0.0.1:5000/", "7") == (
        "http://127.0.0.1:5000/#/experiments/7/runs"
        "?workflowType=machine_learning&viewStateShareKey=runs-by-invocation"
    )
    key, value = runs_view_tag()
    assert key == "mlflow.sharedViewState.runs-by-invocation"
    envelope = json.loads(value)  # the envelope the UI reads: a name, times in ms, the state as a string
    assert isinstance(envelope["name"], str) and isinstance(envelope["createdAt"], int)
    assert isinstance(envelope["state"], str) and json.loads(envelope["state"])["groupBy"]


def test_concurrent_jobs_on_tracking_server(tmp_path: Path, store: Path, sqlite_env: dict[str, str]) -> None:
    shutil.copy(store.parent / "template.db", tmp_path / "srv.db")  # spares the server the migrations
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{tmp_path}/srv.db",
         "--default-artifact-root", str(tmp_path / "art"), "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, so its worker processes are stopped with it
    )  # fmt: skip

    def wait_until_up() -> None:
        deadline = time.monotonic() + HANG_SECONDS
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                exited = server.poll() is not None
                why = f"it exited with {server.returncode}" if exited else f"no answer in {HANG_SECONDS} s"
                log_tail = (tmp_path / "server.log").read_text()[-3000:]
                pytest.fail(f"the mlflow server at {url} did not start ({why}); its log:\n{log_tail}")
            time.sleep(0.25)

    try:
        results = tmp_path / "results"
        results.mkdir()
        # The job processes import MLflow while the server boots; they start logging once it answers.
        run_workers(3, results, {**sqlite_env, "MLFLOW_TRACKING_URI": url}, before_go=wait_until_up)

        client = MlflowClient(url)
        check_invocation(client, 3, "inv-test")
        # The marker experiment that made parent creation atomic was hidden again.
        exp_id = client.get_experiment_by_name("exp").experiment_id
        marker = client.get_experiment_by_name(f".rredcot-claim/{exp_id}/inv-test")
        assert marker is not None and marker.lifecycle_stage == "deleted"
        active = client.search_experiments(view_type=ViewType.ACTIVE_ONLY)
        assert sorted(e.name for e in active) == ["Default", "exp"]
        assert not (results / "mlflow.db").exists()  # the server, not a local database, got everything
    finally:
        stop_server(server, timeout=10)
        log.close()
