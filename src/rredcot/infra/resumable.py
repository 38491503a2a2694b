"""The scaffold of a resumable, stoppable, tracked job (``train``, ``sft``): :func:`resumable_job`.

Around the job's training it does, in this order:

1. finds where the job starts: the newest complete checkpoint of this job, if any
   (:func:`rredcot.infra.resume.prepare_shared`; checkpoints of another config or other inputs are
   deleted);
2. notes SLURM's stop signal instead of dying of it (:func:`rredcot.infra.resume.stop_on_signal`):
   the Trainer finishes its step, saves a checkpoint and stops, and the job raises
   :class:`rredcot.infra.resume.Preempted` (exit 75);
3. opens the job's MLflow run (:func:`rredcot.infra.tracking.stage_run`), continuing an earlier
   attempt's run when it resumes; a job that stopped on the signal ends it KILLED;
4. notes the job's fingerprint, run and journal next to its checkpoints
   (:func:`rredcot.infra.resume.record`);
5. runs the block: the training, and writing the outputs;
6. once every process is done, deletes the checkpoints (:func:`rredcot.infra.resume.discard`). A
   block that raises skips this: a kill before this point resumes at the last checkpoint.

On a job of several processes every process calls it; only the main process has a run, writes the
bookkeeping and deletes. docs/resume.md describes the whole.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rredcot.infra.resume import StopOnSignal, discard, fingerprint, prepare_shared, record, stop_on_signal

if TYPE_CHECKING:
    from rredcot.infra.tracking import JobRun


@dataclass(frozen=True)
class Attempt:
    """One attempt at a resumable job: its MLflow run (None on the processes other than the main one),
    the checkpoint it resumes from (None: from scratch) and the stop signal's Trainer callback."""

    run: JobRun | None
    resume_from: Path | None
    stop: StopOnSignal


@contextmanager
def resumable_job(
    cfg: Mapping[str, Any],
    state: Any,
    checkpoints: Path,
    settings: Mapping[str, Any],
    inputs: Iterable[str | Path],
    *,
    rule: str,
    name: str,
    resume: bool,
    save_every: int,
    log: logging.Logger,
    tags: Mapping[str, Any] | None = None,
    **run_fields: Any,
) -> Iterator[Attempt]:
    """Run the block as one attempt at the job ``name`` of ``rule`` (module docstring).

    ``state``: the job's processes (an accelerate ``PartialState``); ``checkpoints``: the job's
    checkpoint folder; ``settings`` and ``inputs``: what its result depends on (the checkpoints are
    resumed only under the same, :func:`rredcot.infra.resume.fingerprint`). ``resume`` (the config's
    switch) and ``save_every`` > 0 (checkpoints are kept) both needed to resume. ``log``: the stage's
    logger, which says which checkpoint it resumes from. ``tags`` and ``run_fields`` (``params``,
    ``arm``, ``seed``) go to the MLflow run, the tags with the resumed checkpoint's."""
    from rredcot.infra.tracking import stage_run  # late, as the jobs import it: it loads MLflow

    main_process = state.is_main_process
    save = save_every > 0
    digest = fingerprint(settings, inputs)
    # The main process decides where to start (it may delete stale checkpoints); the others follow.
    start = prepare_shared(state, checkpoints, digest, resume and save, rule)
    if start.checkpoint and main_process:
        log.info(f"resuming from {start.checkpoint.name}")
    # SLURM's signal before preemption or the time limit stops the job at a checkpoint (exit 75).
    with (
        stop_on_signal(save=save) as stop,
        stage_run(
            cfg,
            name,
            rule=rule,
            tags={**(tags or {}), **start.tags},
            resume=start.run_id,
            journal=start.journal,
            active=main_process,
            **run_fields,
        ) as run,
    ):
        if main_process and save:
            record(checkpoints, digest, run.run_id, run.journal_id)
        yield Attempt(run, start.checkpoint, stop)
    state.wait_for_everyone()
    if main_process:
        discard(checkpoints)  # only now: a kill before this point resumes at the last step
