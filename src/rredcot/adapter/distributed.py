"""The credit passes inside a distributed run: whole parameters for scoring, and data across processes.

The method core (``rredcot.method.assign``) runs plain forward passes, a data-dependent number of them: a
process whose traces are longer or whose answers depart more often from greedy decoding runs more.
Under DDP and DeepSpeed ZeRO-1/2 every process holds all parameters, so those passes are local.
Under ZeRO-3 and FSDP each layer gathers its shards in every forward, a collective call: processes
running different numbers of forwards would wait for each other forever. So :func:`scoring_model`
makes the parameters whole on each process for the duration of the credit passes, the way TRL does
for generation (``unwrap_model_for_generation`` gathers ZeRO-3 parameters; FSDP2 modules are
unsharded and kept so), and the passes inside make no collective call at all. Entering and leaving
is one collective per process per batch, whatever the data. This costs one unsharded copy of the
model per GPU while credit is computed, as generation with ``ds3_gather_for_generation`` does.

FSDP1 (``FullyShardedDataParallel``) reshards a unit after each forward even inside
``summon_full_params``, so it cannot give whole parameters for many forwards; use FSDP2
(``fsdp_version: 2``, ``config/accelerate/fsdp.yaml``).

The helpers below the context manager gather small Python objects (group completions, credit
statistics) so that results do not depend on how a batch is split over processes.

A process of a multi-process job waits at exit until gloo's worker threads are idle
(:func:`settle_gloo_workers`, registered by :func:`process_state`); without it, a process could
abort at exit on a busy machine ("terminate called without an active exception").
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

_log = logging.getLogger(__name__)


class UnsupportedBackend(RuntimeError):
    """The distributed setup cannot give the credit passes whole parameters."""


FSDP1_MESSAGE = (
    "credit passes need whole parameters for a data-dependent number of forwards; FSDP1 reshards after "
    "every forward. Use FSDP2 (fsdp_version: 2, e.g. config/accelerate/fsdp.yaml)."
)


def backend_name(accelerator: Any) -> str:
    """``single``, ``ddp``, ``zero1``/``zero2``/``zero3``, ``fsdp1`` or ``fsdp2`` for an Accelerator."""
    state = accelerator.state
    ds = getattr(state, "deepspeed_plugin", None)
    if ds is not None:
        return f"zero{int(ds.zero_stage)}"
    fsdp = getattr(state, "fsdp_plugin", None)
    if fsdp is not None:
        return f"fsdp{int(getattr(fsdp, 'fsdp_version', 1) or 1)}"
    return "ddp" if accelerator.num_processes > 1 else "single"


def check_backend(accelerator: Any, gather_zero3: bool) -> None:
    """Raise :class:`UnsupportedBackend` with the fix when credit passes cannot run under it."""
    name = backend_name(accelerator)
    if name == "fsdp1":
        raise UnsupportedBackend(FSDP1_MESSAGE)
    if name == "zero3" and not gather_zero3:
        raise UnsupportedBackend(
            "under ZeRO-3 the credit passes score with the parameters gathered, as TRL generates with "
            "ds3_gather_for_generation=True; set it back to True (the default)"
        )


@contextmanager
def scoring_model(accelerator: Any, wrapped: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """The plain module of ``wrapped`` with whole parameters, in eval mode, for the block.

    Every process must enter and leave together (one collective each under ZeRO-3 and FSDP2); no
    forward inside needs another process. The module's train/eval mode is restored on exit.
    """
    with whole_parameters(wrapped, backend_name(accelerator), accelerator) as model:
        was_training = model.training
        model.eval()
        try:
            yield model
        finally:
            model.train(was_training)


@contextmanager
def whole_parameters(
    wrapped: torch.nn.Module, backend: str, accelerator: Any = None
) -> Iterator[torch.nn.Module]:
    """The plain module of ``wrapped`` whose forwards need no other process, under ``backend``
    (:func:`backend_name`); ``accelerator`` unwraps DDP and DeepSpeed engines."""
    if backend == "zero3":
        from trl.models import unwrap_model_for_generation

        with unwrap_model_for_generation(wrapped, accelerator, gather_deepspeed3_params=True) as model:
            yield model
    elif backend == "fsdp2":
        with _fsdp2_whole(wrapped):
            yield wrapped
    elif backend == "fsdp1":
        raise UnsupportedBackend(FSDP1_MESSAGE)
    else:
        yield accelerator.unwrap_model(wrapped) if accelerator is not None else wrapped


@contextmanager
def _fsdp2_whole(model: torch.nn.Module) -> Iterator[None]:
    """Unshard every FSDP2 module of ``model`` and keep it unsharded across forwards, then reshard."""
    from torch.distributed.fsdp import FSDPModule

    modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for m in modules:
        m.unshard()
    for m in modules:
        m.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for m in modules:
            # FSDP2's default: reshard after forward (accelerate's fsdp_reshard_after_forward: true).
            m.set_reshard_after_forward(True, recurse=False)
            m.reshard()


def gather_objects(accelerator: Any, items: list[Any]) -> list[Any]:
    """Every process's ``items``, concatenated in process order (the local list on one process)."""
    if accelerator.num_processes == 1:
        return list(items)
    from accelerate.utils import gather_object

    return gather_object(list(items))


def average_gradients(grads: list[torch.Tensor]) -> None:
    """Average gradients over every process of the default process group, in place: one all-reduce
    of one flat buffer (every process passes the same parameters' gradients, in the same order and
    dtype). For a model each process keeps whole and trains by hand beside the policy, which no
    wrapper of the launcher averages (PRIME's reward model)."""
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    torch.distributed.all_reduce(flat)
    flat.div_(torch.distributed.get_world_size())
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def process_state() -> Any:
    """accelerate's PartialState of this process (one process, or its share of `accelerate launch`).

    On a machine without CUDA it must be asked for the CPU backend (gloo): the default would take
    the processes of ``accelerate launch --multi_gpu`` for independent single processes. In a
    multi-process job it also makes the process wait for gloo's workers at exit (see below).
    """
    from accelerate import PartialState

    state = PartialState(cpu=not torch.cuda.is_available())
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        _settle_at_exit()
    return state


# ------------------------------------------------------------------------- leaving a gloo process
# Why a process waits for gloo's workers before the interpreter shuts down (torch 2.13, Python 3.11):
# a gloo process group runs each collective on a worker thread ("pt_gloo_runloop"), which drops its
# reference to the finished work after the caller has been told the work is complete. Dropping the
# last C++ reference to a tensor that Python also holds hands the tensor's PyObject back to Python
# (c10::TensorImpl::decref_pyobject, noexcept): torch checks Py_IsInitialized(), then takes the GIL.
# If the main thread starts finalizing the interpreter between the two, Python ends the worker with
# pthread_exit() inside that noexcept code, and std::terminate aborts the process: "terminate called
# without an active exception" (SIGABRT), after the job's work is done. The process groups outlive
# the job (DeepSpeed keeps references in its groups and on every ZeRO-3 parameter, and
# destroy_process_group() does not end the threads of a group still referenced), so the exit
# handler below waits, with the GIL released, until every gloo worker is asleep and stays asleep: a
# worker still holding a finished work is runnable or wakes to take the GIL, so it is waited for; an
# idle one sleeps until the next collective, which never comes.
GLOO_WORKER = "pt_gloo_runloop"  # torch's name for a gloo process group's worker threads


def _gloo_workers() -> dict[str, tuple[str, ...]]:
    """Scheduler state and context-switch counts of this process's gloo worker threads, by thread id
    (Linux /proc; empty where there is none)."""
    workers = {}
    for task in Path("/proc/self/task").glob("*"):
        try:
            if (task / "comm").read_text().strip() != GLOO_WORKER:
                continue
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
            status = (task / "status").read_text().splitlines()
        except (OSError, IndexError):
            continue  # the thread has just ended
        workers[task.name] = (state, *(line for line in status if "ctxt_switches" in line))
    return workers


def settle_gloo_workers(timeout: float = 10.0, interval: float = 0.02) -> bool:
    """Wait until every gloo worker thread is asleep and has not run for ``interval`` seconds
    (the GIL is free meanwhile); True then or when there are none, False after ``timeout``."""
    deadline = time.monotonic() + timeout
    seen = None
    while True:
        now = _gloo_workers()
        if not now or (now == seen and all(w[0] == "S" for w in now.values())):
            return True
        if time.monotonic() > deadline:
            _log.warning("gloo workers still busy after %.0f s at exit; exiting anyway", timeout)
            return False
        seen = now
        time.sleep(interval)


_settle_registered = False


def _settle_at_exit() -> None:
    """Run :func:`settle_gloo_workers` when the interpreter exits, after later-registered handlers
    (atexit runs them last in, first out); registered once per process."""
    global _settle_registered
    if not _settle_registered:
        atexit.register(settle_gloo_workers)
        _settle_registered = True


def save_model_whole(trainer: Any, tok: Any, target: Path) -> None:
    """Save the trained model whole or not at all, from any number of processes.

    Every process takes part (ZeRO-3 and FSDP gather the weights for the save); the main process
    writes into a fresh temporary folder and renames it over ``target`` only when it is complete.
    """
    state = trainer.accelerator
    tmp = target.with_name(f".{target.name}.partial")
    if state.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
    state.wait_for_everyone()
    trainer.save_model(str(tmp))
    state.wait_for_everyone()
    if state.is_main_process:
        tok.save_pretrained(tmp)
        for name in ("training_args.bin",):  # TrainingArguments: not part of the model
            (tmp / name).unlink(missing_ok=True)
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
    state.wait_for_everyone()
