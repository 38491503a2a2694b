"""MLflow tracking for workflow jobs: one run per job, grouped under one parent run per invocation.

The store is ``MLFLOW_TRACKING_URI`` when set (e.g. a tracking server on a cluster, as started by
``rredcot tracking server``), otherwise a sqlite database ``<results_dir>/mlflow.db`` with artifacts
under ``<results_dir>/mlartifacts``.

Every job (a separate process, often several at once) calls :func:`job_run`::

    with job_run("grpo-rredcot-s1", results_dir="results", experiment="rredcot", rule="train_grpo",
                 arm="rredcot", seed=1, params=cfg) as run:
        run.log_metrics({"loss": 0.3}, step=10)

Concurrency: sqlite answers "database is locked" when processes write at the same time, and can
fail outright when two processes create (migrate) a fresh database together. So each store call
goes through :func:`retry` (backoff, bounded time), and the one-off setup (store creation,
experiment and parent run lookup/creation) runs under an ``fcntl`` lock file next to the database.
For other stores (a tracking server) the parent run is claimed through a server-side atomic step:
experiment names are unique, so exactly one process manages to create a marker experiment
``.rredcot-claim/<experiment id>/<invocation>``; it creates the parent run and deletes the marker
(deleted experiments keep their name, so the claim stays taken); the others wait for the parent.

The parent run is a container: it is (re)marked RUNNING when a job starts and FINISHED when a job
ends and no sibling is still running, whatever the jobs' outcome. A killed job (SIGKILL) stays
RUNNING, and so does its parent, which is the honest answer.

A job that resumes from a checkpoint passes the id of its earlier run as ``resume``: that run is
reopened (RUNNING again, ``rredcot.attempt`` counted up) and moved under this invocation's parent,
and the old parent is finished once none of its jobs runs. A run that is gone (deleted, or in another
store) is replaced by a new one tagged ``rredcot.previous_run``.

A sqlite URL option ``?timeout=60`` is accepted by MLflow 3.17, but it does not help: MLflow sets
``PRAGMA busy_timeout = 20000`` on every session, overriding it. We therefore keep the plain URL.
"""

from __future__ import annotations

import fcntl
import logging
import math
import os
import random
import re
import secrets
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote

import sqlalchemy.exc
from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.utils.validation import MAX_METRICS_PER_BATCH, MAX_PARAM_VAL_LENGTH, MAX_TAG_VAL_LENGTH

INVOCATION_ENV = "RREDCOT_INVOCATION"
TAG_PREFIX = "rredcot."
PARENT_TAG = "mlflow.parentRunId"
RETRY_SECONDS = 60.0
CLAIM_WAIT_SECONDS = 30.0
_CLAIM_PREFIX = ".rredcot-claim/"
_SAFE_ID = re.compile(r"[A-Za-z0-9._-]+")

_log = logging.getLogger(__name__)
T = TypeVar("T")


# --------------------------------------------------------------------------------------------- store
def tracking_uri(results_dir: str | Path) -> str:
    """``MLFLOW_TRACKING_URI`` if set, else ``sqlite:///<abs results_dir>/mlflow.db`` (dir created)."""
    if env := os.environ.get("MLFLOW_TRACKING_URI"):
        return env
    root = Path(results_dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{root}/mlflow.db"


def invocation_id() -> str:
    """The workflow invocation id from ``RREDCOT_INVOCATION``, else a new ``YYYYmmdd-HHMMSS-xxxxxx``."""
    return os.environ.get(INVOCATION_ENV) or f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI, or None for any other store."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(unquote(uri.removeprefix("sqlite:///").split("?", 1)[0])).resolve()


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``fcntl`` lock on ``path`` (created if needed); released even if we crash."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _is_transient(exc: BaseException) -> bool:
    """Errors worth retrying: lock contention and other operational (connection, I/O) database errors,
    which MLflow's SQL store reports as TEMPORARILY_UNAVAILABLE, as a server does when overloaded."""
    if isinstance(exc, sqlalchemy.exc.OperationalError):
        return True
    if isinstance(exc, MlflowException) and exc.error_code == "TEMPORARILY_UNAVAILABLE":
        return True
    return "database is locked" in str(exc)


def retry(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call ``fn``, retrying transient store errors with jittered exponential backoff for up to 60 s."""
    deadline = time.monotonic() + RETRY_SECONDS
    delay = 0.05
    while True:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if not _is_transient(exc) or time.monotonic() + delay > deadline:
                raise
            _log.debug("transient tracking error, retrying in %.2fs: %s", delay, exc)
        # Jitter so that writers which collided once don't collide again in lockstep.
        time.sleep(delay * random.uniform(0.5, 1.5))
        delay = min(delay * 2, 2.0)


class _DropLockNoise(logging.Filter):
    """MLflow logs a full traceback for every "database is locked" it raises; we retry those."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "database is locked" not in record.getMessage()


logging.getLogger("mlflow.store.db.utils").addFilter(_DropLockNoise())


# ---------------------------------------------------------------------------------------- params
def flatten_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Flatten nested mappings to ``a.b.c`` keys with string values cut to MLflow's length limit."""
    flat: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten_params(value, f"{name}."))
        else:
            flat[name] = str(value)[:MAX_PARAM_VAL_LENGTH]
    return flat


def _as_metric(value: Any) -> float | None:
    """``value`` as a finite float, or None (strings, None, NaN, inf ...) so a bad value can't crash a job."""
    if isinstance(value, str | bytes):
        return None
    try:
        number = float(value)  # also covers numpy scalars and 0-d tensors
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def metric_name(key: str) -> str:
    """A name MLflow accepts: ``avg@4`` becomes ``avg_at_4``, other disallowed characters ``_``."""
    return re.sub(r"[^\w\-. :/]", "_", key.replace("@", "_at_"))


class JobRun:
    """One job's MLflow run. Every call names ``run_id`` explicitly and never touches the fluent
    active-run stack, so a training library that uses ``mlflow.start_run`` can't redirect our logging."""

    def __init__(self, client: MlflowClient, run_id: str) -> None:
        self.client = client
        self.run_id = run_id
        self._skipped: set[str] = set()  # warn once per metric key, not once per step

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Log one step of metrics in a single batch (step defaults to 0, as in MLflow).

        Non-numeric or non-finite values are skipped with a warning (once per key), not logged."""
        batch = self._metrics(metrics, step, int(time.time() * 1000))
        if batch:
            retry(self.client.log_batch, self.run_id, metrics=batch)

    def log_steps(self, rows: Sequence[tuple[int, Mapping[str, Any]]], tags: Mapping[str, Any]) -> None:
        """Log the metrics of several ``(step, metrics)`` rows, then ``tags``, in few store calls.

        The tags go with the last call, after its metrics, so a tag that records what was logged is
        never set unless all of it is in the store. The converse does not hold: a call is not one
        transaction (MLflow's SQL store commits a batch's metrics, then its tags, separately), so a
        kill can leave the metrics in the store without the tag (:meth:`metric_steps` tells)."""
        now = int(time.time() * 1000)
        batch = [m for step, metrics in rows for m in self._metrics(metrics, step, now)]
        tag_batch = [RunTag(k, str(v)[:MAX_TAG_VAL_LENGTH]) for k, v in tags.items()]
        room = MAX_METRICS_PER_BATCH - len(tag_batch)  # MLflow caps the entities of one call
        while len(batch) > room:
            retry(self.client.log_batch, self.run_id, metrics=batch[:room])
            batch = batch[room:]
        retry(self.client.log_batch, self.run_id, metrics=batch, tags=tag_batch)

    def _metrics(self, metrics: Mapping[str, Any], step: int | None, now: int) -> list[Metric]:
        batch = []
        for key, value in metrics.items():
            number = _as_metric(value)
            if number is None:
                if key not in self._skipped:
                    self._skipped.add(key)
                    _log.warning("skipping metric %r=%r (step %s): not a finite number", key, value, step)
                continue
            batch.append(Metric(metric_name(key), number, now, step or 0))
        return batch

    def metric_steps(self) -> dict[str, set[int]]:
        """The steps the run has of each metric (by its MLflow name), as they are in the store."""
        keys = retry(self.client.get_run, self.run_id).data.metrics
        return {k: {m.step for m in retry(self.client.get_metric_history, self.run_id, k)} for k in keys}

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Log (flattened) params. MLflow params are write-once: re-logging a key needs the same value."""
        flat = flatten_params(params)
        if flat:
            retry(self.client.log_batch, self.run_id, params=[Param(k, v) for k, v in flat.items()])

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        """Set tags (values stringified and cut to MLflow's limit)."""
        batch = [RunTag(k, str(v)[:MAX_TAG_VAL_LENGTH]) for k, v in tags.items()]
        if batch:
            retry(self.client.log_batch, self.run_id, tags=batch)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Copy one file into the run's artifacts (optionally under ``artifact_path``)."""
        retry(self.client.log_artifact, self.run_id, str(path), artifact_path)

    def log_artifacts(self, directory: str | Path, artifact_path: str | None = None) -> None:
        """Copy a directory's contents into the run's artifacts."""
        retry(self.client.log_artifacts, self.run_id, str(directory), artifact_path)


# ---------------------------------------------------------------------------------- experiment/runs
# Ours hold training runs, not GenAI traces. MLflow 3.17's UI does not open an experiment by this tag
# (its GenAI / Model training switch decides): ``rredcot tracking ui`` prints the link to the runs.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"


def _experiment_id(client: MlflowClient, name: str, artifact_location: str | None) -> str:
    """Id of experiment ``name``, creating it if missing (a concurrent creator is fine), marked as a
    model-training experiment."""
    for _ in range(2):
        if (exp := retry(client.get_experiment_by_name, name)) is not None:
            if exp.tags.get(EXPERIMENT_KIND_TAG) is None:
                retry(client.set_experiment_tag, exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
            return exp.experiment_id
        try:
            tags = {EXPERIMENT_KIND_TAG: EXPERIMENT_KIND}
            return retry(client.create_experiment, name, artifact_location=artifact_location, tags=tags)
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
    raise RuntimeError(f"experiment {name!r} could neither be found nor created")


def _find_parent(client: MlflowClient, exp_id: str, invocation: str) -> str | None:
    """The earliest parent run of ``invocation`` in the experiment, if any."""
    runs = retry(
        client.search_runs,
        [exp_id],
        f"tags.`{TAG_PREFIX}invocation` = '{invocation}' and tags.`{TAG_PREFIX}kind` = 'invocation'",
        max_results=1,
        order_by=["attributes.start_time ASC"],
    )
    return runs[0].info.run_id if runs else None


def _create_parent(client: MlflowClient, exp_id: str, invocation: str) -> str:
    tags = {f"{TAG_PREFIX}invocation": invocation, f"{TAG_PREFIX}kind": "invocation"}
    run = retry(client.create_run, exp_id, run_name=f"invocation-{invocation}", tags=tags)
    return run.info.run_id


def _claim_parent(client: MlflowClient, exp_id: str, invocation: str) -> str:
    """Find or create the parent run on a shared server, race-free via a unique marker experiment."""
    deadline = time.monotonic() + CLAIM_WAIT_SECONDS
    while time.monotonic() < deadline:
        if found := _find_parent(client, exp_id, invocation):
            return found
        try:
            marker = retry(client.create_experiment, f"{_CLAIM_PREFIX}{exp_id}/{invocation}")
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            time.sleep(random.uniform(0.2, 0.6))  # another job holds the claim: wait for its parent
            continue
        parent = _create_parent(client, exp_id, invocation)
        retry(client.delete_experiment, marker)  # hide the marker; its name stays reserved
        return parent
    # The claimant died before creating the parent; a duplicate beats blocking the workflow.
    _log.warning("no parent run appeared for invocation %s; creating one", invocation)
    return _find_parent(client, exp_id, invocation) or _create_parent(client, exp_id, invocation)


def _end(client: MlflowClient, exp_id: str, run_id: str, parent_id: str, status: str) -> None:
    """End the job run, then mark the parent FINISHED unless a sibling is still running."""
    retry(client.set_terminated, run_id, status)
    _finish_if_idle(client, exp_id, parent_id)


def _finish_if_idle(client: MlflowClient, exp_id: str, parent_id: str) -> None:
    running = retry(
        client.search_runs,
        [exp_id],
        f"tags.`{PARENT_TAG}` = '{parent_id}' and attributes.status = 'RUNNING'",
        max_results=1,
    )
    if not running:
        retry(client.set_terminated, parent_id, "FINISHED")


def _reopen(client: MlflowClient, exp_id: str, run_id: str, tags: dict[str, str]) -> dict[str, str] | None:
    """Reopen the run of an earlier attempt of this job under this invocation's parent run.

    Returns the params the run already has, or None when it can't be continued (deleted, or not in
    this experiment and store)."""
    try:
        old = retry(client.get_run, run_id)
    except MlflowException as exc:
        _log.warning("run %s of the earlier attempt can't be reopened: %s", run_id, exc)
        return None
    if old.info.lifecycle_stage != "active" or old.info.experiment_id != exp_id:
        return None
    before = old.data.tags
    tags = {**tags, f"{TAG_PREFIX}attempt": str(int(before.get(f"{TAG_PREFIX}attempt", "1")) + 1)}
    if before.get(f"{TAG_PREFIX}invocation") not in (None, tags[f"{TAG_PREFIX}invocation"]):
        tags[f"{TAG_PREFIX}previous_invocation"] = before[f"{TAG_PREFIX}invocation"]
    retry(client.update_run, run_id, status="RUNNING")  # a killed attempt left it RUNNING or FAILED
    retry(client.log_batch, run_id, tags=[RunTag(k, v) for k, v in tags.items()])
    old_parent = before.get(PARENT_TAG)
    if old_parent and old_parent != tags[PARENT_TAG]:
        _finish_if_idle(client, exp_id, old_parent)  # the killed invocation may have nothing left running
    return dict(old.data.params)


@contextmanager
def job_run(
    name: str,
    *,
    results_dir: str | Path,
    experiment: str,
    rule: str,
    params: Mapping[str, Any] | None = None,
    tags: Mapping[str, Any] | None = None,
    arm: str | None = None,
    seed: int | None = None,
    resume: str | None = None,
) -> Iterator[JobRun]:
    """Run the block as one MLflow run named ``name``, nested under this invocation's parent run.

    The run ends FINISHED if the block succeeds, FAILED if it raises (KILLED on Ctrl-C); the exception
    propagates. ``params`` are logged flattened; ``tags`` are added to the ``rredcot.*`` tags.
    ``resume``: the run id of an earlier attempt of this job, reopened if possible (module docstring).
    """
    uri = tracking_uri(results_dir)
    invocation = invocation_id()
    if not _SAFE_ID.fullmatch(invocation):  # it is quoted into search filters
        raise ValueError(f"{INVOCATION_ENV}={invocation!r}: use only letters, digits, '.', '_', '-'")
    db = sqlite_path(uri)
    # Next to the database, one folder per experiment, so results_dir holds everything of a run.
    artifacts = (db.parent / "mlartifacts" / re.sub(r"[^\w.-]", "_", experiment)).as_uri() if db else None
    with _file_lock(db.with_name(db.name + ".lock")) if db else nullcontext():
        client = retry(MlflowClient, uri)  # creating the store migrates a fresh database
        exp_id = _experiment_id(client, experiment, artifacts)
        if db:  # the lock makes search-then-create atomic among the processes of this machine
            parent_id = _find_parent(client, exp_id, invocation) or _create_parent(client, exp_id, invocation)
    if not db:
        parent_id = _claim_parent(client, exp_id, invocation)

    run_tags = {
        PARENT_TAG: parent_id,
        f"{TAG_PREFIX}kind": "job",
        f"{TAG_PREFIX}invocation": invocation,
        f"{TAG_PREFIX}rule": rule,
        **({f"{TAG_PREFIX}arm": arm} if arm is not None else {}),
        **({f"{TAG_PREFIX}seed": str(seed)} if seed is not None else {}),
        **{k: str(v)[:MAX_TAG_VAL_LENGTH] for k, v in (tags or {}).items()},
    }
    known = _reopen(client, exp_id, resume, run_tags) if resume else None
    if known is not None:
        run = JobRun(client, resume)
    else:
        if resume:
            run_tags[f"{TAG_PREFIX}previous_run"] = resume
        run = JobRun(client, retry(client.create_run, exp_id, run_name=name, tags=run_tags).info.run_id)
    retry(client.update_run, parent_id, status="RUNNING")  # after our run exists: see _end
    try:
        if params:  # a reopened run keeps the params it has: MLflow params are write-once
            run.log_params({k: v for k, v in flatten_params(params).items() if k not in (known or {})})
        yield run
    except BaseException as exc:
        try:
            status = "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"
            _end(client, exp_id, run.run_id, parent_id, status)
        except Exception:  # never mask the job's own error with a tracking error
            _log.exception("could not mark run %s as failed", run.run_id)
        raise
    _end(client, exp_id, run.run_id, parent_id, "FINISHED")


def stage_run(
    cfg: Mapping[str, Any], name: str, active: bool = True, **kwargs: Any
) -> AbstractContextManager[JobRun | None]:
    """``job_run`` for a pipeline stage: the store and experiment come from the validated config.

    ``active=False`` (the other processes of a multi-process job) gives ``None`` and logs nothing."""
    if not active:
        return nullcontext(None)
    return job_run(name, results_dir=cfg["results_dir"], experiment=cfg["experiment"], **kwargs)
