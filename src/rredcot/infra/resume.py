"""Checkpoints that let a killed training job (``train``, ``sft``) resume where it stopped.

A job keeps its checkpoints in a folder of its own, by default ``<results_dir>/checkpoints/sft`` and
``<results_dir>/checkpoints/train/<arm>/seed<seed>``: outside the job's declared outputs, because
Snakemake deletes the outputs of a failed job and the checkpoints are what must survive it. The
folder holds the Trainer's ``checkpoint-N`` folders and ``job.json``: a fingerprint of what the job
computes (settings and inputs) and the id of its MLflow run. On start, :func:`prepare` discards
checkpoints of a different job (changed config or inputs) and finds the newest complete one; the job
then continues its MLflow run. After the job's outputs are written the folder is deleted.

:class:`RunLogger` keeps the MLflow run in step with the checkpoints (see there).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from rredcot.infra.io import write_json

_log = logging.getLogger(__name__)

JOB_FILE = "job.json"
LOGGED_TAG = "rredcot.logged_step"
SAVE_TOTAL_LIMIT = 2  # the newest checkpoint plus one to fall back on if the newest was cut short
_CHECKPOINT = re.compile(r"checkpoint-(\d+)")


@dataclass(frozen=True)
class Resume:
    """Where a job starts: a checkpoint (None = from scratch) and the MLflow run to continue."""

    checkpoint: Path | None = None
    run_id: str | None = None

    @property
    def step(self) -> int:
        return checkpoint_step(self.checkpoint) if self.checkpoint else 0

    @property
    def tags(self) -> dict[str, str]:
        """MLflow tags of the attempt: which checkpoint it resumed from."""
        return {"rredcot.resumed_from": self.checkpoint.name} if self.checkpoint else {}


def checkpoint_step(path: Path) -> int:
    return int(_CHECKPOINT.fullmatch(path.name).group(1))


def fingerprint(settings: Mapping[str, Any], inputs: Iterable[str | Path]) -> str:
    """Digest of the settings and of each input file's path, size and mtime (as Snakemake judges).

    Settings that don't change the result (thread counts, checkpoint interval) must be left out by
    the caller, so that changing them doesn't throw the checkpoints away."""
    files = []
    for item in inputs:  # a path that is no file (a hub model id) counts by its name alone
        root = Path(item).resolve()
        found = sorted(root.rglob("*")) if root.is_dir() else [root]
        files.append(
            [str(root), [[str(f), f.stat().st_size, f.stat().st_mtime_ns] for f in found if f.is_file()]]
        )
    text = json.dumps({"settings": settings, "files": files}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def is_resumable(path: Path) -> bool:
    """Whether training can resume from checkpoint ``path``.

    The Trainer writes ``trainer_state.json`` last, so a save cut short leaves it missing or
    truncated. The checkpoint of the last step doesn't count either: resumed there, the Trainer would
    take one step too many (it checks for the end only after a step); the one before serves instead.
    """
    try:
        state = json.loads((path / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return False
    return state.get("global_step") == checkpoint_step(path) < state.get("max_steps", 0)


def latest_checkpoint(directory: Path) -> Path | None:
    """The newest checkpoint to resume from; newer ones are deleted, so that the Trainer's rotation
    (which keeps the newest folders) never keeps one of those instead of a good one."""
    found = [p for p in directory.glob("checkpoint-*") if _CHECKPOINT.fullmatch(p.name) and p.is_dir()]
    for path in sorted(found, key=checkpoint_step, reverse=True):
        if is_resumable(path):
            return path
        shutil.rmtree(path, ignore_errors=True)
    return None


def prepare(directory: Path, digest: str, enabled: bool, stage: str) -> Resume:
    """Where the job in ``directory`` starts; checkpoints that can't be resumed are deleted."""
    if not directory.is_dir() or not any(directory.iterdir()):
        return Resume()
    try:
        job = json.loads((directory / JOB_FILE).read_text())
    except (OSError, ValueError):
        job = {}
    why = (
        "resuming is off in the config"
        if not enabled
        else "they belong to another config or other inputs"
        if job.get("fingerprint") != digest
        else None
    )
    if why:
        _log.info("%s: discarding the checkpoints in %s: %s", stage, directory, why)
        shutil.rmtree(directory)
        return Resume()
    return Resume(latest_checkpoint(directory), job.get("mlflow_run_id"))


def prepare_shared(state: Any, directory: Path, digest: str, enabled: bool, stage: str) -> Resume:
    """:func:`prepare` for a job of one or more processes (an accelerate ``PartialState``): the main
    process decides (it may delete checkpoints) and the others receive its decision."""
    decided = [prepare(directory, digest, enabled, stage) if state.is_main_process else None]
    if state.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        broadcast_object_list(decided)
    return decided[0]


def record(directory: Path, digest: str, run_id: str) -> None:
    """Note the job's fingerprint and MLflow run next to its checkpoints (before the first one)."""
    write_json(directory / JOB_FILE, {"fingerprint": digest, "mlflow_run_id": run_id})


def discard(directory: Path) -> None:
    """Delete the checkpoints of a job whose outputs are complete."""
    shutil.rmtree(directory, ignore_errors=True)


class RunLogger(TrainerCallback, ExportableState):
    """Logs a Trainer's metrics to the job's MLflow run in step with the checkpoints.

    With checkpoints on, metrics are held back until the checkpoint that covers their step is saved
    and then logged, with the tag ``rredcot.logged_step`` (the last step logged): a killed job leaves
    in MLflow the steps it will resume after. The held-back metrics are also saved in the checkpoint
    (``trainer_state.json``, through ``ExportableState``), and a resumed job logs those the run is
    missing: the kill may come between saving and logging.

    What the run has is read from its metric history, not from the tag: MLflow's SQL store commits a
    batch's metrics and its tags in separate transactions, so a kill between the two leaves steps in
    the run that the tag doesn't count. A metric is never logged at a step the run already has, so
    each step is there exactly once whenever the kill comes; this also covers a job that resumes
    before its last checkpoint (see :func:`is_resumable`) or starts over, and redoes steps the run has.

    Subclasses add their own state with :meth:`extra_state`, get it back in :meth:`resumed`, and
    start afresh in :meth:`started`. In a multi-process run only the main process has a run; on the
    others ``run`` is None and nothing is logged.
    """

    def __init__(self, run: Any, hold: bool) -> None:
        self.run = run
        self.hold = hold
        self.pending: list[tuple[int, dict[str, float]]] = []
        self.present: dict[str, set[int]] = {}  # the steps the MLflow run has, by metric (MLflow name)

    def missing(self, metrics: Mapping[str, float], step: int) -> dict[str, float]:
        """The metrics of ``step`` that the MLflow run doesn't have yet."""
        if not self.present:
            return dict(metrics)
        from rredcot.infra.tracking import metric_name  # as the jobs import it: late, it loads MLflow

        return {k: v for k, v in metrics.items() if step not in self.present.get(metric_name(k), ())}

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        if self.run is None or not (metrics := self.missing(metrics, step)):
            return
        if self.hold:
            self.pending.append((step, metrics))
        else:
            self.run.log_metrics(metrics, step=step)

    def flush(self) -> None:
        if self.run is not None and self.pending:
            self.run.log_steps(self.pending, {LOGGED_TAG: self.pending[-1][0]})
            self.pending = []

    def state(self) -> dict[str, Any]:
        return {"args": {}, "attributes": {"pending": self.pending, **self.extra_state()}}

    def extra_state(self) -> dict[str, Any]:
        return {}

    def started(self, state: Any, model: Any) -> None:
        """Training starts from scratch."""

    def resumed(self, saved: Mapping[str, Any], state: Any) -> None:
        """Training resumes from a checkpoint whose callback state is ``saved``."""

    def on_train_begin(self, args, state, control, model=None, **kw):  # noqa: ANN001
        if self.hold and self.run is not None:  # a continued run may have steps already
            self.present = self.run.metric_steps()
        # On resume the Trainer has loaded the checkpoint's trainer_state.json into `state`.
        saved = state.stateful_callbacks.get(type(self).__name__)
        if state.global_step == 0 or not isinstance(saved, Mapping):
            self.started(state, model)
            return
        attributes = saved["attributes"]
        pending = ((step, self.missing(m, step)) for step, m in attributes["pending"])
        self.pending = [(step, m) for step, m in pending if m] if self.run is not None else []
        self.resumed(attributes, state)

    def on_save(self, args, state, control, **kw):  # noqa: ANN001
        self.flush()

    def on_train_end(self, args, state, control, **kw):  # noqa: ANN001
        self.flush()
