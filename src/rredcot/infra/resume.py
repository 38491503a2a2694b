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
import signal
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from rredcot.infra.io import fsync_tree, write_json
from rredcot.infra.stopping import PREEMPTED_EXIT, STOP_SIGNALS

_log = logging.getLogger(__name__)

JOB_FILE = "job.json"
LOGGED_TAG = "rredcot.logged_step"
# The newest checkpoint plus one to fall back on if the newest was cut short. At least 2: the Trainer
# rotates (deletes the oldest) before the newest is sealed, so the previous sealed one must stay.
SAVE_TOTAL_LIMIT = 2
_CHECKPOINT = re.compile(r"checkpoint-(\d+)")
SEAL_FILE = "rredcot-complete.json"
"""In a checkpoint folder: written last, it lists every file of the checkpoint with its size."""


@dataclass(frozen=True)
class Resume:
    """Where a job starts: a checkpoint (None = from scratch), the MLflow run and the tracking journal
    to continue (:mod:`rredcot.infra.journal`; the run id is None if the store was never reached)."""

    checkpoint: Path | None = None
    run_id: str | None = None
    journal: str | None = None

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
    """Whether training can resume from checkpoint ``path`` as far as its state tells (whether all of
    it was saved is :func:`check_checkpoint`'s question).

    Its ``trainer_state.json`` must parse and be of its step. The checkpoint of the last step doesn't
    count: resumed there, the Trainer would take one step too many (it checks for the end only after
    a step); the one before serves instead.
    """
    try:
        state = json.loads((path / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return False
    return state.get("global_step") == checkpoint_step(path) < state.get("max_steps", 0)


def seal_checkpoint(path: Path) -> dict[str, int]:
    """Flush checkpoint ``path`` to disk and seal it: write :data:`SEAL_FILE` (atomically, last)
    with the size of each of its files; returns those sizes.

    Call it once every file of the checkpoint is written (for a Trainer: :func:`seal_saved`). The
    seal records sizes, not checksums: a save cut short leaves a file missing or shorter than its
    whole size, and since the data is on disk before the seal exists, a crash afterwards can't
    shorten it either. A checksum would read every byte back after each save (minutes for the
    optimizer state of a model of billions of parameters) to catch only what the disk corrupts
    later, which is not what a cut-short save does.
    """
    (path / SEAL_FILE).unlink(missing_ok=True)  # a stale seal must never cover new files
    sizes = fsync_tree(path)
    write_json(path / SEAL_FILE, {"step": checkpoint_step(path), "files": sizes})
    return sizes


def seal_saved(args: Any, state: Any) -> Path | None:
    """Seal the checkpoint a Trainer has just saved; call it from ``on_save`` on every process.

    The Trainer calls ``on_save`` on each process once that process has written its part of the
    checkpoint (weights, optimizer, RNG state; a shard each under DeepSpeed or FSDP). Each process
    flushes the folder's files to disk, all wait for each other (a barrier), then the process that
    writes ``trainer_state.json`` (``args.should_save``) seals it: the seal covers every shard.
    Returns the sealed folder on that process, None on the others."""
    from accelerate import PartialState

    folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
    if folder.is_dir():
        fsync_tree(folder)  # what this process wrote, on disk before the others are told it's done
    PartialState().wait_for_everyone()
    if not (args.should_save and folder.is_dir()):
        return None
    seal_checkpoint(folder)
    return folder


def check_checkpoint(path: Path) -> str | None:
    """Why checkpoint ``path`` is not complete (no seal, a file missing or of another size than
    sealed), or None when it is. A checkpoint written before checkpoints were sealed has no seal and
    counts as incomplete: it can't be told apart from one whose save was cut short."""
    try:
        seal = json.loads((path / SEAL_FILE).read_text())
        files = seal["files"]
        sizes = {str(name): int(size) for name, size in files.items()}
    except FileNotFoundError:
        return f"it has no {SEAL_FILE}: its save did not finish (or it predates sealed checkpoints)"
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        return f"its {SEAL_FILE} is unreadable ({type(exc).__name__}: {exc})"
    if seal.get("step") != checkpoint_step(path):
        return f"its {SEAL_FILE} is that of step {seal.get('step')}"
    for name, size in sizes.items():
        try:
            found = (path / name).stat().st_size
        except OSError:
            return f"{name} is missing (sealed with {size} bytes)"
        if found != size:
            return f"{name} has {found} bytes, sealed with {size}"
    return None


def discard_checkpoint(path: Path) -> None:
    """Delete checkpoint folder ``path``, its seal first: a folder that is only partly deleted (a
    kill, a busy file on a network file system) is never taken for a complete one."""
    (path / SEAL_FILE).unlink(missing_ok=True)
    shutil.rmtree(path, ignore_errors=True)


def latest_checkpoint(directory: Path) -> Path | None:
    """The newest complete checkpoint to resume from (:func:`check_checkpoint`,
    :func:`is_resumable`). Newer ones are deleted, each with a warning that says why it was skipped,
    so that the Trainer's rotation (which keeps the newest folders) never keeps one of those instead
    of a good one, and no later save goes into a folder with files of an earlier one."""
    found = [p for p in directory.glob("checkpoint-*") if _CHECKPOINT.fullmatch(p.name) and p.is_dir()]
    for path in sorted(found, key=checkpoint_step, reverse=True):
        torn = check_checkpoint(path)
        if torn is None and is_resumable(path):
            return path
        if torn:
            _log.warning("skipping %s in %s: %s", path.name, directory, torn)
        else:
            _log.info("skipping %s in %s: the last step's, or not its step's state", path.name, directory)
        discard_checkpoint(path)
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
    return Resume(latest_checkpoint(directory), job.get("mlflow_run_id"), job.get("journal"))


def prepare_shared(state: Any, directory: Path, digest: str, enabled: bool, stage: str) -> Resume:
    """:func:`prepare` for a job of one or more processes (an accelerate ``PartialState``): the main
    process decides (it may delete checkpoints) and the others receive its decision."""
    decided = [prepare(directory, digest, enabled, stage) if state.is_main_process else None]
    if state.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        broadcast_object_list(decided)
    return decided[0]


def record(directory: Path, digest: str, run_id: str | None, journal: str | None = None) -> None:
    """Note the job's fingerprint, MLflow run and tracking journal next to its checkpoints (before the
    first one)."""
    write_json(directory / JOB_FILE, {"fingerprint": digest, "mlflow_run_id": run_id, "journal": journal})


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

    What the run has is read from the job's tracking journal (``JobRun.metric_steps``), which a rerun
    continues, not from the store: resuming needs no store, and the journal has what was logged
    whether or not it has reached the store yet. A metric is never logged at a step the run already
    has, so each step is there exactly once whenever the kill comes; this also covers a job that
    resumes before its last checkpoint (see :func:`is_resumable`) or starts over, and redoes steps the
    run has.

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
        seal_saved(args, state)  # on every process, before logging: the checkpoint first
        self.flush()

    def on_train_end(self, args, state, control, **kw):  # noqa: ANN001
        self.flush()


class Preempted(SystemExit):
    """A job that stopped on :data:`STOP_SIGNALS` (after saving a checkpoint if it keeps any): it
    exits with :data:`PREEMPTED_EXIT` and writes no outputs, so that the workflow reruns it and the
    rerun resumes at ``step``. Its MLflow run ends KILLED (:func:`rredcot.infra.tracking.job_run`)."""

    def __init__(self, signum: int, step: int) -> None:
        super().__init__(PREEMPTED_EXIT)
        self.signum, self.step = signum, step

    def __str__(self) -> str:
        return f"stopped on {signal.Signals(self.signum).name} at step {self.step}; rerun to resume there"


class StopOnSignal(TrainerCallback):
    """Stops training at a checkpoint when the job is asked to stop (:data:`STOP_SIGNALS`).

    SLURM signals a job before it kills it (preemption, time limit; ``KillWait`` later comes SIGKILL):
    the step in progress is finished, then the Trainer saves a checkpoint at that step through its
    normal save path (``control.should_save``, as for the periodic saves) and stops; :meth:`check`
    then raises :class:`Preempted`. A signal during the last step is not acted on: the job ends
    normally instead. A second signal changes nothing (the save under way goes on undisturbed).

    The processes of a multi-process job may receive the signal at different moments, yet must save
    the same step: each step they all-reduce the flag (one scalar), so they stop together at the
    first step one of them has the signal. ``save=False`` (a job without checkpoints) stops without
    saving. Use :func:`stop_on_signal` to install the handler."""

    def __init__(self, save: bool) -> None:
        self.save = save
        self.signum: int | None = None  # the first stop signal received
        self.stopped_at: int | None = None

    def received(self, signum: int, frame: Any = None) -> None:
        """The signal handler: only notes the request (the Trainer acts on it at the step's end). It
        writes nothing: a handler that writes to a stream the interrupted code was writing to raises
        "reentrant call" there; :meth:`on_step_end` says what happened."""
        if self.signum is None:
            self.signum = signum

    def agreed(self) -> bool:
        """Whether any process of the job was asked to stop (every process must call this per step)."""
        asked = self.signum is not None
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            import torch

            nccl = dist.get_backend() == "nccl"
            device = torch.device("cuda", torch.cuda.current_device()) if nccl else "cpu"
            flag = torch.tensor([float(asked)], device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            asked = bool(flag.item())
        return asked

    def on_step_end(self, args, state, control, **kw):  # noqa: ANN001
        if self.stopped_at is None and self.agreed() and state.global_step < state.max_steps:
            self.stopped_at = state.global_step
            why = (
                f"{signal.Signals(self.signum).name} received"
                if self.signum
                else "another process was signalled"
            )
            self.signum = self.signum or STOP_SIGNALS[0]
            control.should_save = control.should_save or self.save
            control.should_training_stop = True
            saving = "saving a checkpoint" if self.save else "no checkpoints kept"
            _log.warning("%s: stopping at step %d (%s)", why, state.global_step, saving)
        return control

    def check(self) -> None:
        """After training: raise :class:`Preempted` if it stopped on a signal."""
        if self.stopped_at is not None:
            stopped = Preempted(self.signum, self.stopped_at)
            _log.warning("%s (exit %d)", stopped, PREEMPTED_EXIT)
            raise stopped


@contextmanager
def stop_on_signal(save: bool) -> Iterator[StopOnSignal]:
    """Within the block, :data:`STOP_SIGNALS` are noted by the returned :class:`StopOnSignal` (to be
    given to the Trainer) instead of ending the process; the previous handlers come back after it.
    Must run on the main thread (Python's signal handlers)."""
    stop = StopOnSignal(save)
    previous = {sig: signal.signal(sig, stop.received) for sig in STOP_SIGNALS}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
