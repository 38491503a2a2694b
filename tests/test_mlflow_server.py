"""``rredcot tracking server`` as jobs on a cluster use it: a real ``mlflow server`` (sqlite backend,
proxied artifacts) that several job processes log to at once through the project's tracking API."""

from __future__ import annotations

import base64
import configparser
import dataclasses
import os
import re
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from hangs import HANG_SECONDS
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from tracking_server import serve

from rredcot.settings.config import Tracking
from rredcot.tools.tracking import JOBS_USER, auth_paths, main, prepare_auth, read_env_file

JOBS, RUNS_PER_JOB, STEPS = 4, 3, 10
# One job process: several runs, each with params, a metric history and an artifact. It knows the
# server only from MLFLOW_TRACKING_URI. Started while the server boots, it waits for it (as a SLURM job
# would not need to): that overlaps the imports of all processes.
WORKER = """
import os, sys, time, urllib.request
from pathlib import Path
from rredcot.infra.tracking import job_run

scratch, job = Path(sys.argv[1]), int(sys.argv[2])
deadline = time.monotonic() + HANG_SECONDS  # a server that dies fails the test at once
while True:
    try:
        urllib.request.urlopen(os.environ["MLFLOW_TRACKING_URI"] + "/health", timeout=2).close()
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.25)
for k in range(RUNS_PER_JOB):
    with job_run(f"job{job}-run{k}", results_dir=scratch, experiment="server-test", rule="train",
                 arm=f"arm{job}", seed=k, params={"lr": 0.01 * job, "opt": {"k": k}}, **TIMEOUTS) as run:
        for step in range(STEPS):
            run.log_metrics({"loss": 1.0 / (step + 1), "job": job}, step=step)
        out = scratch / f"job{job}-run{k}.txt"
        out.write_text(f"{job}/{k}")
        run.log_artifact(out, "outputs")
"""
WORKER = WORKER.replace("RUNS_PER_JOB", str(RUNS_PER_JOB)).replace("STEPS", str(STEPS))
WORKER = WORKER.replace("HANG_SECONDS", str(HANG_SECONDS))
WORKER = WORKER.replace("TIMEOUTS", repr(dataclasses.asdict(Tracking())))  # the config's default timeouts


def test_print_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    assert main(["server", "--results-dir", str(results), "--port", "5123", "--print-only"]) == 0
    out = capsys.readouterr().out
    assert f"--backend-store-uri sqlite:///{results.resolve()}/mlflow.db" in out
    assert f"--artifacts-destination {results.resolve()}/mlartifacts --serve-artifacts" in out
    assert "--allowed-hosts" not in out  # loopback only: MLflow's defaults suffice
    assert "--app-name" not in out  # loopback: no authentication unless asked for (--auth)
    assert out.splitlines()[-1] == "export MLFLOW_TRACKING_URI=http://127.0.0.1:5123"
    assert not results.exists()  # printing creates nothing

    # Serving other nodes: they call us by name, which the server must accept as a Host header.
    main(["server", "--host", "0.0.0.0", "--port", "5123", "--print-only", "--results-dir", str(results)])
    out = capsys.readouterr().out
    uri = re.search(r"^export MLFLOW_TRACKING_URI=http://(\S+):5123$", out, re.M)
    assert uri and uri.group(1) not in ("0.0.0.0", "localhost")
    assert f"{uri.group(1)}:*" in out.split("--allowed-hosts", 1)[1]
    assert "--app-name basic-auth" in out  # other nodes get in only with a user and password
    assert not results.exists()  # the credentials are made when the server starts, not printed


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, Path, subprocess.Popen]]:
    """A tracking server on loopback without authentication (see :func:`serve`)."""
    with serve(tmp_path) as started:
        yield started


def run_jobs(tmp_path: Path, env: dict[str, str], server_proc: subprocess.Popen, jobs: int) -> None:
    """Run ``jobs`` :data:`WORKER` processes at once against the server; fail with their output."""
    scratch = tmp_path / "job-scratch"  # the jobs' results_dir: must stay without a local store
    scratch.mkdir()
    logs = [tmp_path / f"job{j}.log" for j in range(jobs)]
    procs = []
    for j, log in enumerate(logs):
        with log.open("w") as out:
            command = [sys.executable, "-c", WORKER, str(scratch), str(j)]
            procs.append(subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT))
    try:
        # However long the jobs take: a server that dies fails the test at once, a hang after HANG_SECONDS.
        deadline = time.monotonic() + HANG_SECONDS
        while any(job.poll() is None for job in procs):
            assert server_proc.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the jobs hang"
            time.sleep(0.2)
    finally:
        for job in procs:
            if job.poll() is None:
                job.kill()
                job.wait()
    for job, log in zip(procs, logs, strict=True):
        assert job.returncode == 0, log.read_text() + (tmp_path / "server.log").read_text()[-3000:]


def test_concurrent_jobs_log_to_server(server: tuple[str, Path, subprocess.Popen], tmp_path: Path) -> None:
    uri, results, server_proc = server
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "RREDCOT_INVOCATION": "inv-server"}
    scratch = tmp_path / "job-scratch"
    start = time.monotonic()
    run_jobs(tmp_path, env, server_proc, JOBS)
    print(f"server boot + {JOBS} jobs x {RUNS_PER_JOB} runs: {time.monotonic() - start:.1f}s")

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("server-test")
    where = "tags.`rredcot.invocation` = 'inv-server' and tags.`rredcot.kind` = "
    parents = client.search_runs([exp.experiment_id], where + "'invocation'")
    runs = client.search_runs([exp.experiment_id], where + "'job'", max_results=100)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    expected = sorted(f"job{j}-run{k}" for j in range(JOBS) for k in range(RUNS_PER_JOB))
    assert sorted(r.info.run_name for r in runs) == expected
    for run in runs:
        j, k = map(int, re.fullmatch(r"job(\d+)-run(\d+)", run.info.run_name).groups())
        assert run.info.status == "FINISHED"
        assert run.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        assert run.data.params == {"lr": str(0.01 * j), "opt.k": str(k)}
        history = client.get_metric_history(run.info.run_id, "loss")
        assert sorted(m.step for m in history) == list(range(STEPS))
        assert run.data.metrics["job"] == j
        # The artifact went through the server (proxied) into the server's artifact root.
        assert [a.path for a in client.list_artifacts(run.info.run_id, "outputs")] == [
            f"outputs/{run.info.run_name}.txt"
        ]
    local = client.download_artifacts(runs[0].info.run_id, "outputs", str(tmp_path))
    assert (Path(local) / f"{runs[0].info.run_name}.txt").read_text().count("/") == 1
    stored = sorted(p.name for p in (results / "mlartifacts").rglob("job*-run*.txt"))
    assert stored == [f"{name}.txt" for name in expected]
    assert (results / "mlflow.db").exists() and not (scratch / "mlflow.db").exists()


def test_auth_files_private(tmp_path: Path) -> None:
    """The credentials are made once, in files only their owner can read, and a server whose files
    others could read refuses to start: anyone who reads them logs in as the admin or the jobs."""
    paths = prepare_auth(tmp_path)
    assert stat.S_IMODE(paths["folder"].stat().st_mode) == 0o700
    for name in ("ini", "jobs_env", "database"):
        assert stat.S_IMODE(paths[name].stat().st_mode) == 0o600, name
    jobs = read_env_file(paths["jobs_env"])
    assert jobs["MLFLOW_TRACKING_USERNAME"] == JOBS_USER and len(jobs["MLFLOW_TRACKING_PASSWORD"]) >= 24
    first = {name: paths[name].read_text() for name in ("ini", "jobs_env")}
    prepare_auth(tmp_path)  # a restart keeps the credentials
    assert {name: paths[name].read_text() for name in ("ini", "jobs_env")} == first

    for name, opened in [("ini", 0o640), ("jobs_env", 0o604), ("database", 0o660), ("folder", 0o750)]:
        private = stat.S_IMODE(paths[name].stat().st_mode)
        paths[name].chmod(opened)
        with pytest.raises(SystemExit, match=rf"refusing to start .*{re.escape(str(paths[name]))}.*chmod"):
            prepare_auth(tmp_path)
        paths[name].chmod(private)


def _group_cmdlines(pgid: int) -> dict[int, bytes]:
    """The command lines of the processes in process group ``pgid`` (a server and its workers)."""
    found = {}
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:
                found[int(stat_file.parent.name)] = (stat_file.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):  # gone meanwhile
            continue
    return found


def _status(url: str, user: str | None = None, password: str = "") -> int:
    """The HTTP status of a GET, with basic auth when ``user`` is given."""
    request = urllib.request.Request(url)
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=HANG_SECONDS) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


def test_server_with_auth(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`rredcot tracking server --auth`: only its users get in, the pipeline's jobs log with the
    credentials of ``jobs.env`` from their environment, and no password shows on a command line,
    in the server's output or in the tracking store."""
    jobs = 3
    with serve(tmp_path, "--auth") as (uri, results, server_proc):
        paths = auth_paths(results)  # made before the URI is printed
        creds = read_env_file(paths["jobs_env"])
        ini = configparser.ConfigParser()
        ini.read(paths["ini"])
        admin, admin_password = ini["mlflow"]["admin_username"], ini["mlflow"]["admin_password"]
        secrets = [admin_password, creds["MLFLOW_TRACKING_PASSWORD"], ini["rredcot"]["flask_secret_key"]]
        env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "RREDCOT_INVOCATION": "inv-auth", **creds}
        run_jobs(tmp_path, env, server_proc, jobs)  # they boot while the server does

        api = f"{uri}/api/2.0/mlflow/experiments/search?max_results=5"
        assert _status(api) == 401
        assert _status(api, creds["MLFLOW_TRACKING_USERNAME"], "wrong-" + secrets[1]) == 401
        assert _status(api, admin, creds["MLFLOW_TRACKING_PASSWORD"]) == 401
        assert _status(api, *creds.values()) == 200

        for name, value in creds.items():
            monkeypatch.setenv(name, value)
        client = MlflowClient(uri)
        exp = client.get_experiment_by_name("server-test")
        runs = client.search_runs([exp.experiment_id], "tags.`rredcot.kind` = 'job'", max_results=100)
        assert sorted(r.info.run_name for r in runs) == sorted(
            f"job{j}-run{k}" for j in range(jobs) for k in range(RUNS_PER_JOB)
        )
        for run in runs:
            assert run.info.status == "FINISHED" and run.data.params["opt.k"] in "012"
            assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "loss")) == list(
                range(STEPS)
            )
        # An experiment of another user: the jobs log there (EDIT), but cannot delete it.
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", admin)
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", admin_password)
        other = client.create_experiment("admins")
        for name, value in creds.items():
            monkeypatch.setenv(name, value)
        client.log_metric(client.create_run(other).info.run_id, "x", 1.0)
        with pytest.raises(MlflowException, match="PERMISSION_DENIED|403"):
            client.delete_experiment(other)

        cmdlines = _group_cmdlines(server_proc.pid)
        assert len(cmdlines) >= 2, cmdlines  # the mlflow server and its uvicorn worker
        for pid, cmdline in cmdlines.items():
            assert not [s for s in secrets if s.encode() in cmdline], f"a secret in /proc/{pid}/cmdline"
    # Everything the server and the jobs wrote, except the credential folder itself.
    written = [tmp_path / "server.log", *tmp_path.glob("job*.log"), *(tmp_path / "job-scratch").rglob("*")]
    written += [p for p in results.rglob("*") if paths["folder"] not in p.parents]
    assert (results / "mlflow.db") in written
    for path in written:
        if path.is_file():
            content = path.read_bytes()
            assert not [s for s in secrets if s.encode() in content], f"a secret in {path}"
