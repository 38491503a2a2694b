"""How a training job is asked to stop at a checkpoint, and how it says it did: kept free of heavy
imports, so that ``rredcot launch`` knows them without loading the training libraries.

SLURM signals a job before it kills it (preemption, time limit: docs/resume.md, "Preemption and
time limits"); a train or SFT job stops at a checkpoint on :data:`STOP_SIGNALS`
(:class:`rredcot.infra.resume.StopOnSignal`) and exits with :data:`PREEMPTED_EXIT`, a failure to
Snakemake, which reruns it, resuming at that checkpoint.
"""

from __future__ import annotations

import os
import signal

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
"""What asks a job to stop at a checkpoint: SLURM's signal before preemption or the time limit."""
PREEMPTED_EXIT = os.EX_TEMPFAIL
"""75 (sysexits.h): the job stopped on request at a checkpoint; rerun it to resume there."""
