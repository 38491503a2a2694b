"""MLflow tracking for workflow jobs: one run per job, grouped under one parent run per invocation.

The store is ``MLFLOW_TRACKING_URI`` when set (e.g. a tracking server on a cluster, as started by
``rredcot tracking server``), otherwise a sqlite database ``<results_dir>/mlflow.db`` with artifacts
under ``<results_dir>/mlartifacts``.

Every job (a separate process, often several at once) calls :func:`job_run`; a pipeline stage calls
it through :func:`stage_run`, which takes the store, the experiment and the timeouts from the config::

    with stage_run(cfg, "grpo-rredcot-s1", rule="train_grpo", arm="rredcot", seed=1, params=cfg) as run:
        run.log_metrics({"loss": 0.3}, step=10)

Concurrency: sqlite answers "database is locked" when processes write at the same time, and can
fail outright when two processes create (migrate) a fresh database together. So each store call
goes through :func:`retry` (backoff, bounded time), and the one-off setup (store creation,
experiment and parent run lookup/creation) runs under a lock file next to the database (filelock).
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

Tracking never costs a job: what a job logs goes to its journal first (:mod:`rredcot.infra.journal`,
``<results_dir>/journal/``) and a courier thread delivers it, in order, whenever the store answers;
all the store calls above (run, parent, reopen, end) happen in that delivery. A job started while the
store is down runs to the end; its run is created when the store is first reached, found by its tag
``rredcot.journal`` so that it is never created twice. At the end the job waits at most
``tracking.flush_timeout_s`` for delivery, then warns what is pending; ``rredcot tracking sync``
delivers it later. MLflow's own HTTP retries (minutes by default) are cut to 2 tries of
``tracking.request_timeout_s`` each unless ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` / ``_TIMEOUT`` are set.

A sqlite URL option ``?timeout=60`` is accepted by MLflow 3.17, but it does not help: MLflow sets
``PRAGMA busy_timeout = 20000`` on every session, overriding it. We therefore keep the plain URL.
"""

from __future__ import annotations

import logging
import math
import os
import random
import re
import secrets
import shlex
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit, urlunsplit

import sqlalchemy.exc
import tenacity
from filelock import FileLock
from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.utils.validation import MAX_METRICS_PER_BATCH, MAX_PARAM_VAL_LENGTH, MAX_TAG_VAL_LENGTH

from rredcot.infra.journal import Courier, Journal, new_journal_id
from rredcot.infra.stopping import PREEMPTED_EXIT

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


def _is_transient(exc: BaseException) -> bool:
    """Errors worth retrying: lock contention and other operational (connection, I/O) database errors,
    which MLflow's SQL store reports as TEMPORARILY_UNAVAILABLE, as a server does when overloaded."""
    if isinstance(exc, sqlalchemy.exc.OperationalError):
        return True
    if isinstance(exc, MlflowException) and exc.error_code == "TEMPORARILY_UNAVAILABLE":
        return True
    return "database is locked" in str(exc)


def retry(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call ``fn``, retrying transient store errors with jittered exponential backoff (50 ms doubling
    to at most 2 s) for up to 60 s; the last error is raised as it was."""
    # Jitter, so that writers which collided once don't collide again in lockstep.
    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception(_is_transient),
        wait=tenacity.wait_exponential_jitter(initial=0.05, max=2.0, jitter=0.05),
        stop=tenacity.stop_after_delay(RETRY_SECONDS),
        before_sleep=lambda state: _log.debug(
            "transient tracking error, retrying: %s", state.outcome.exception() if state.outcome else None
        ),
        reraise=True,
    )
    return retrying(fn, *args, **kwargs)


class _DropLockNoise(logging.Filter):
    """MLflow logs a full traceback for every "database is locked" it raises; we retry those."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "database is locked" not in record.getMessage()


logging.getLogger("mlflow.store.db.utils").addFilter(_DropLockNoise())


# ---------------------------------------------------------------------------------------- params
def flatten_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Flatten nested mappings to ``a.b.c`` keys with string values cut to MLflow's length limit.

    A secret never becomes a param: the value under a key that names one (``token``, ``hub_token``,
    ``password``, ``secret``, ``api_key``, ...) and a value holding the hub token or the tracking
    password of this process's environment are logged as ``[redacted]``. Params are what anyone who
    may read a run sees; a token could reach them through a free-form part of the config (an arm's
    ``credit_options``), a URL with credentials, or a stage that logs its arguments."""
    known = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN")
    held = [v for v in (os.environ.get(n, "") for n in known) if len(v) >= 8]  # not short ones like "x"
    secret_key = re.compile(r"(?:^|_)(?:token|password|passwd|secret|api_?key|credentials?)$", re.I)
    flat: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten_params(value, f"{name}."))
        elif secret_key.search(str(key)) or any(s in str(value) for s in held):
            flat[name] = "[redacted]"
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
    """One job's MLflow run, written through the job's journal (:mod:`rredcot.infra.journal`).

    Each call appends a record to the journal and returns: the courier thread delivers it to the
    store when the store answers. Delivery names the run explicitly and never touches the fluent
    active-run stack, so a training library that uses ``mlflow.start_run`` can't redirect our logging.
    Without a courier (``courier=None``) records wait in the journal for ``rredcot tracking sync``."""

    def __init__(self, journal: Journal, courier: Courier | None = None) -> None:
        self.journal = journal
        self.courier = courier
        self._skipped: set[str] = set()  # warn once per metric key, not once per step

    @property
    def journal_id(self) -> str:
        """The journal's id: what a rerun of the job passes as ``job_run(journal=...)``."""
        return self.journal.id

    @property
    def run_id(self) -> str | None:
        """The MLflow run's id, or None while the store has not been reached."""
        return self.journal.state().get("run_id")

    def _append(self, record: dict[str, Any]) -> None:
        self.journal.append(record)
        if self.courier is not None:
            self.courier.notify()

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Log one step of metrics in a single batch (step defaults to 0, as in MLflow).

        Non-numeric or non-finite values are skipped with a warning (once per key), not logged."""
        batch = self._metrics(metrics, step, int(time.time() * 1000))
        if batch:
            self._append({"op": "metrics", "metrics": batch, "tags": {}})

    def log_steps(self, rows: Sequence[tuple[int, Mapping[str, Any]]], tags: Mapping[str, Any]) -> None:
        """Log the metrics of several ``(step, metrics)`` rows, then ``tags``, as one journal record.

        A record is in the journal whole or not at all, and it is delivered with the tags after its
        metrics, so a tag that records what was logged is never set unless all of it is in the store."""
        now = int(time.time() * 1000)
        batch = [m for step, metrics in rows for m in self._metrics(metrics, step, now)]
        self._append({"op": "metrics", "metrics": batch, "tags": _tag_values(tags)})

    def _metrics(self, metrics: Mapping[str, Any], step: int | None, now: int) -> list[list[Any]]:
        batch = []
        for key, value in metrics.items():
            number = _as_metric(value)
            if number is None:
                if key not in self._skipped:
                    self._skipped.add(key)
                    _log.warning("skipping metric %r=%r (step %s): not a finite number", key, value, step)
                continue
            batch.append([metric_name(key), number, now, step or 0])
        return batch

    def metric_steps(self) -> dict[str, set[int]]:
        """The steps the run has of each metric (by its MLflow name), as the journal has them: logged,
        delivered or not. Needs no store."""
        steps: dict[str, set[int]] = {}
        for record in self.journal.records():
            if record["op"] == "metrics":
                for key, _value, _time, step in record["metrics"]:
                    steps.setdefault(key, set()).add(step)
        return steps

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Log (flattened) params. MLflow params are write-once: a key the run has keeps its value."""
        flat = flatten_params(params)
        if flat:
            self._append({"op": "params", "params": flat})

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        """Set tags (values stringified and cut to MLflow's limit)."""
        if tags:
            self._append({"op": "tags", "tags": _tag_values(tags)})

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Copy one file into the run's artifacts (optionally under ``artifact_path``), as it is now."""
        self._append({"op": "artifact", "file": self.journal.keep(path), "artifact_path": artifact_path})

    def log_artifacts(self, directory: str | Path, artifact_path: str | None = None) -> None:
        """Copy a directory's contents into the run's artifacts, as they are now."""
        kept = self.journal.keep(directory)
        self._append({"op": "artifacts", "dir": kept, "artifact_path": artifact_path})


def _tag_values(tags: Mapping[str, Any]) -> dict[str, str]:
    return {k: str(v)[:MAX_TAG_VAL_LENGTH] for k, v in tags.items()}


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


def _create_parent(client: MlflowClient, exp_id: str, invocation: str, start_time: int | None = None) -> str:
    tags = {f"{TAG_PREFIX}invocation": invocation, f"{TAG_PREFIX}kind": "invocation"}
    run = retry(client.create_run, exp_id, start_time, tags, f"invocation-{invocation}")
    return run.info.run_id


def _claim_parent(client: MlflowClient, exp_id: str, invocation: str, start_time: int | None = None) -> str:
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
        parent = _create_parent(client, exp_id, invocation, start_time)
        retry(client.delete_experiment, marker)  # hide the marker; its name stays reserved
        return parent
    # The claimant died before creating the parent; a duplicate beats blocking the workflow.
    _log.warning("no parent run appeared for invocation %s; creating one", invocation)
    return _find_parent(client, exp_id, invocation) or _create_parent(client, exp_id, invocation, start_time)


def _finish_if_idle(client: MlflowClient, exp_id: str, parent_id: str) -> None:
    running = retry(
        client.search_runs,
        [exp_id],
        f"tags.`{PARENT_TAG}` = '{parent_id}' and attributes.status = 'RUNNING'",
        max_results=1,
    )
    if not running:
        retry(client.set_terminated, parent_id, "FINISHED")


def _reopen(
    client: MlflowClient, exp_id: str, run_id: str, tags: dict[str, str], attempt: int | None = None
) -> dict[str, str] | None:
    """Reopen the run of an earlier attempt of this job under this invocation's parent run.

    ``attempt``: the attempt's number (default: the run's count plus one). Returns the params the run
    already has, or None when it can't be continued (deleted, or not in this experiment and store)."""
    try:
        old = retry(client.get_run, run_id)
    except MlflowException as exc:
        _log.warning("run %s of the earlier attempt can't be reopened: %s", run_id, exc)
        return None
    if old.info.lifecycle_stage != "active" or old.info.experiment_id != exp_id:
        return None
    before = old.data.tags
    if attempt is None:
        attempt = int(before.get(f"{TAG_PREFIX}attempt", "1")) + 1
    tags = {**tags, f"{TAG_PREFIX}attempt": str(attempt)}
    if before.get(f"{TAG_PREFIX}invocation") not in (None, tags[f"{TAG_PREFIX}invocation"]):
        tags[f"{TAG_PREFIX}previous_invocation"] = before[f"{TAG_PREFIX}invocation"]
    retry(client.update_run, run_id, status="RUNNING")  # a killed attempt left it RUNNING or FAILED
    retry(client.log_batch, run_id, tags=[RunTag(k, v) for k, v in tags.items()])
    old_parent = before.get(PARENT_TAG)
    if old_parent and old_parent != tags[PARENT_TAG]:
        _finish_if_idle(client, exp_id, old_parent)  # the killed invocation may have nothing left running
    return dict(old.data.params)


# -------------------------------------------------------------------------------------- delivery
JOURNAL_TAG = f"{TAG_PREFIX}journal"
_clients: dict[str, MlflowClient] = {}


def _client(uri: str) -> MlflowClient:
    """One client per store and process (creating one for a fresh sqlite file migrates it)."""
    if uri not in _clients:
        db = sqlite_path(uri)
        with FileLock(db.with_name(db.name + ".lock")) if db else nullcontext():
            _clients[uri] = retry(MlflowClient, uri)
    return _clients[uri]


def _start(journal: Journal, record: dict[str, Any], state: dict[str, Any]) -> None:
    """Find or create the run of a journal's start record, under its invocation's parent run.

    The run is found by the journal's tag before one is created, so a delivery cut short between
    creating the run and saving the state doesn't create a second one."""
    uri, invocation = record["uri"], record["invocation"]
    if state.get("uri") != uri:  # another store than an earlier attempt's: find the run there afresh
        state.update(uri=uri, run_id=None, base_attempt=None)
    client = _client(uri)
    db = sqlite_path(uri)
    # Runs get the times the job logged, however late they are delivered; the invocation's parent
    # starts just before the job that creates it.
    began = record["time"] - 1
    with FileLock(db.with_name(db.name + ".lock")) if db else nullcontext():
        exp_id = _experiment_id(client, record["experiment"], record["artifacts"])
        if db:  # the lock makes search-then-create atomic among the processes of this machine
            parent_id = _find_parent(client, exp_id, invocation) or _create_parent(
                client, exp_id, invocation, began
            )
    if not db:
        parent_id = _claim_parent(client, exp_id, invocation, began)
    tags = {PARENT_TAG: parent_id, **record["tags"], JOURNAL_TAG: journal.id}
    run_id = state.get("run_id")
    if run_id is None:
        found = retry(client.search_runs, [exp_id], f"tags.`{JOURNAL_TAG}` = '{journal.id}'", max_results=1)
        run_id = found[0].info.run_id if found else None
    previous = None
    if run_id is not None and record["attempt"] > 1:  # a rerun of the job that continues this journal
        attempt = (state.get("base_attempt") or 1) + record["attempt"] - 1
        if _reopen(client, exp_id, run_id, tags, attempt) is None:  # deleted meanwhile
            previous, run_id = run_id, None
    elif run_id is not None:  # the start delivered again after a delivery cut short
        retry(client.log_batch, run_id, tags=[RunTag(k, v) for k, v in tags.items()])
    elif (previous := record.get("resume")) and _reopen(client, exp_id, previous, tags) is not None:
        run_id = previous
        attempt = retry(client.get_run, previous).data.tags.get(f"{TAG_PREFIX}attempt", "1")
        state["base_attempt"] = int(attempt) - record["attempt"] + 1
    if run_id is None:
        if previous:
            tags[f"{TAG_PREFIX}previous_run"] = previous
        run_id = retry(client.create_run, exp_id, record["time"], tags, record["name"]).info.run_id
        state["base_attempt"] = 2 - record["attempt"]  # so that a later start record counts 2, 3, ...
    state.update(run_id=run_id, experiment_id=exp_id, parent_id=parent_id)
    retry(client.update_run, parent_id, status="RUNNING")  # after our run exists: its end finishes the parent


def deliver_record(journal: Journal, record: dict[str, Any], state: dict[str, Any]) -> None:
    """Deliver one journal record to the store; harmless when repeated (a delivery cut short is)."""
    op = record["op"]
    if op == "start":
        return _start(journal, record, state)
    client, run_id = _client(state["uri"]), state["run_id"]
    if op == "metrics":
        # Each value keeps the time it was logged at: MLflow's SQL store drops a metric equal in key,
        # value, time and step to one it has, so a repeated batch adds nothing.
        batch = [Metric(k, v, t, step) for k, v, t, step in record["metrics"]]
        tag_batch = [RunTag(k, v) for k, v in record["tags"].items()]
        room = MAX_METRICS_PER_BATCH - len(tag_batch)  # MLflow caps the entities of one call
        while len(batch) > room:
            retry(client.log_batch, run_id, metrics=batch[:room])
            batch = batch[room:]
        retry(client.log_batch, run_id, metrics=batch, tags=tag_batch)
    elif op == "params":  # write-once: keys the run has (an earlier attempt's) keep their values
        have = retry(client.get_run, run_id).data.params
        new = [Param(k, v) for k, v in record["params"].items() if k not in have]
        for i in range(0, len(new), 100):  # MLflow's cap on the params of one call
            retry(client.log_batch, run_id, params=new[i : i + 100])
    elif op == "tags":
        retry(client.log_batch, run_id, tags=[RunTag(k, v) for k, v in record["tags"].items()])
    elif op == "artifact":
        retry(client.log_artifact, run_id, str(journal.kept(record["file"])), record["artifact_path"])
    elif op == "artifacts":
        retry(client.log_artifacts, run_id, str(journal.kept(record["dir"])), record["artifact_path"])
    elif op == "end":
        retry(client.set_terminated, run_id, record["status"], record["time"])
        _finish_if_idle(client, state["experiment_id"], state["parent_id"])
    else:
        raise ValueError(f"{journal.path}: unknown record {op!r}")
    return None


def pending_summary(records: Sequence[Mapping[str, Any]]) -> str:
    """``N records (M metric values, K artifacts)``: what a list of journal records holds."""
    values = sum(len(r["metrics"]) for r in records if r["op"] == "metrics")
    files = sum(1 for r in records if r["op"] in ("artifact", "artifacts"))
    return f"{len(records)} records ({values} metric values, {files} artifacts)"


def _limit_http_retries(request_timeout_s: float) -> None:
    """MLflow's own HTTP retries last minutes by default; the courier retries instead. A user's own
    ``MLFLOW_HTTP_REQUEST_*`` values win."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(int(math.ceil(request_timeout_s))))


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
    journal: str | None = None,
    flush_timeout_s: float,
    request_timeout_s: float,
) -> Iterator[JobRun]:
    """Run the block as one MLflow run named ``name``, nested under this invocation's parent run.

    The run ends FINISHED if the block succeeds, FAILED if it raises (KILLED if it was stopped from
    outside: :func:`stopped_from_outside`); the exception propagates. ``params`` are logged
    flattened; ``tags`` are added to the ``rredcot.*`` tags.
    Everything goes through the job's journal (:mod:`rredcot.infra.journal`): the block never waits on
    the store, and at its end the job waits up to ``flush_timeout_s`` for delivery, then warns what is
    left for ``rredcot tracking sync``. ``journal``: the journal of an earlier attempt of this job,
    continued (its run reopened); ``resume``: the run id of an earlier attempt, reopened if possible
    when there is no such journal (module docstring). ``flush_timeout_s`` and ``request_timeout_s``
    are the config's ``tracking`` settings (:func:`stage_run` passes them; a caller without a config
    passes the defaults of ``rredcot.settings.config.Tracking``).
    """
    _limit_http_retries(request_timeout_s)
    book = start_journal(
        name, results_dir=results_dir, experiment=experiment, rule=rule, tags=tags, arm=arm, seed=seed,
        resume=resume, journal=journal,
    )  # fmt: skip
    uri = book.records()[-1]["uri"]
    courier = Courier(book, deliver_record, uri)
    courier.try_once()  # a store that answers has the run before the job starts; else the job goes on
    run = JobRun(book, courier.start())
    status = "FINISHED"
    try:
        if params:
            run.log_params(params)
        yield run
    except BaseException as exc:
        status = "KILLED" if stopped_from_outside(exc) else "FAILED"
        raise
    finally:
        _finish(book, courier, status, flush_timeout_s, results_dir)


def stopped_from_outside(exc: BaseException) -> bool:
    """Whether a job ended by ``exc`` was stopped from outside rather than failed: Ctrl-C, or an exit
    with :data:`rredcot.infra.stopping.PREEMPTED_EXIT` (75), the status of a job that stopped at a
    checkpoint on SLURM's signal before preemption or the time limit."""
    return isinstance(exc, KeyboardInterrupt) or (isinstance(exc, SystemExit) and exc.code == PREEMPTED_EXIT)


def start_journal(
    name: str,
    *,
    results_dir: str | Path,
    experiment: str,
    rule: str,
    tags: Mapping[str, Any] | None = None,
    arm: str | None = None,
    seed: int | None = None,
    resume: str | None = None,
    journal: str | None = None,
) -> Journal:
    """Open a job's journal (``journal``, an earlier attempt's, if it is there and free, else a new
    one) and append the start of its run; the job holds it until it closes it. :func:`job_run`'s
    first step, without the courier: what is logged to it waits for :func:`deliver_record`."""
    uri = tracking_uri(results_dir)
    invocation = invocation_id()
    if not _SAFE_ID.fullmatch(invocation):  # it is quoted into search filters
        raise ValueError(f"{INVOCATION_ENV}={invocation!r}: use only letters, digits, '.', '_', '-'")
    db = sqlite_path(uri)
    # Next to the database, one folder per experiment, so results_dir holds everything of a run.
    artifacts = (db.parent / "mlartifacts" / re.sub(r"[^\w.-]", "_", experiment)).as_uri() if db else None
    book = _open_journal(results_dir, name, journal)
    attempt = 1 + sum(1 for r in book.records() if r["op"] == "start")
    run_tags = {
        f"{TAG_PREFIX}kind": "job",
        f"{TAG_PREFIX}invocation": invocation,
        f"{TAG_PREFIX}rule": rule,
        **({f"{TAG_PREFIX}arm": arm} if arm is not None else {}),
        **({f"{TAG_PREFIX}seed": str(seed)} if seed is not None else {}),
        **_tag_values(tags or {}),
    }
    # A password in the URI stays out of the journal: MLflow takes credentials from the environment.
    parts = urlsplit(uri)
    if parts.username or parts.password:
        uri = urlunsplit(parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port else "")))
    start = {"op": "start", "time": int(time.time() * 1000), "uri": uri, "experiment": experiment}
    start |= {"artifacts": artifacts, "invocation": invocation, "name": name, "tags": run_tags}
    book.append({**start, "resume": resume if attempt == 1 else None, "attempt": attempt})
    return book


def _open_journal(results_dir: str | Path, name: str, earlier: str | None) -> Journal:
    """The earlier attempt's journal if it is there and free, else a new one."""
    if earlier and (book := Journal.at(results_dir, earlier)).exists():
        try:
            return book.open()
        except BlockingIOError:
            _log.warning("journal %s is held by a running job; this job starts a new one", book.path)
    return Journal.at(results_dir, new_journal_id(name)).open()


def _finish(book: Journal, courier: Courier, status: str, timeout: float, results_dir: str | Path) -> None:
    """Journal the run's end, wait up to ``timeout`` s for delivery, say what is left."""
    try:
        book.append({"op": "end", "status": status, "time": int(time.time() * 1000)})
        left = courier.drain(timeout)
    except Exception:  # never mask the job's own outcome with a tracking error
        _log.exception("could not journal the end of the run (%s)", book.path)
        return
    finally:
        book.close()
    if left:
        _log.warning(
            "tracking store %s did not take all of the job's logging in %.0f s: %s are pending in %s; "
            "deliver them with: rredcot tracking sync --results-dir %s",
            courier.store,
            timeout,
            pending_summary(left),
            book.path,
            shlex.quote(str(results_dir)),
        )


def stage_run(
    cfg: Mapping[str, Any], name: str, active: bool = True, **kwargs: Any
) -> AbstractContextManager[JobRun | None]:
    """``job_run`` for a pipeline stage: the store and experiment come from the validated config.

    ``active=False`` (the other processes of a multi-process job) gives ``None`` and logs nothing."""
    if not active:
        return nullcontext(None)
    timeouts = {f"{k}_s": cfg["tracking"][f"{k}_s"] for k in ("flush_timeout", "request_timeout")}
    return job_run(name, results_dir=cfg["results_dir"], experiment=cfg["experiment"], **timeouts, **kwargs)
