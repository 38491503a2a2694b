"""The run's vLLM engine, for the work besides TRL's own generation: the credit's greedy answer
baseline and the learning-curve probe.

With ``use_vllm`` TRL generates each step's completions with vLLM, in the training process
(``vllm_mode="colocate"``) or in a ``vllm serve`` server (``"server"``), after pushing the step's
policy weights into it. Right after generation the engine therefore holds exactly the policy the
credit passes score with, and its prefix cache holds the traces it just wrote: the greedy final
solution at a trace's exit is a short generation there (:class:`EngineDecoder`,
:class:`ServerDecoder`), at generation speed, where transformers would decode it token by token.

On a CPU, vLLM's backend packs the linear layers' weights into its kernels, which TRL's colocated
weight sync cannot reach: :func:`use_cpu_weight_sync` gives the run's colocated engine a sync that
loads the weights through vLLM's reload (:func:`rredcot.lm.vllm_engine.load_weights`). TRL's server
mode pushes weights over NCCL, which needs CUDA: on a CPU a server can generate, but not follow the
policy (docs/vllm.md).
"""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from rredcot.adapter.distributed import backend_name, whole_parameters
from rredcot.lm.vllm_engine import engine_options, load_weights, restore_thread_control


class EngineDecoder:
    """Greedy continuations from an in-process ``vllm.LLM`` (a colocated engine)."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm

    def greedy(self, heads: Sequence[Sequence[int]], max_new_tokens: int, stop: str) -> list[list[int]]:
        from vllm import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, stop=[stop] if stop else None)
        outputs = self.llm.generate([{"prompt_token_ids": list(h)} for h in heads], params, use_tqdm=False)
        return [list(out.outputs[0].token_ids) for out in outputs]


class ServerDecoder:
    """Greedy continuations from a ``vllm serve`` server, through TRL's client (each process talks
    to the server itself: a greedy decode needs no collective)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def greedy(self, heads: Sequence[Sequence[int]], max_new_tokens: int, stop: str) -> list[list[int]]:
        if not heads:
            return []
        out = self.client.generate(
            [list(h) for h in heads],
            temperature=0.0,
            max_tokens=max_new_tokens,
            logprobs=None,
            generation_kwargs={"stop": [stop]} if stop else None,
        )
        return [list(ids) for ids in out["completion_ids"]]


def server_client(trainer: Any) -> Any:
    """TRL's client of the run's server on this process (the main process's own, or a new one)."""
    generation = trainer.vllm_generation
    client = getattr(generation, "vllm_client", None)
    if client is None:
        from trl.generation.vllm_client import VLLMClient

        args = trainer.args
        base = args.vllm_server_base_url or f"http://{args.vllm_server_host}:{args.vllm_server_port}"
        client = VLLMClient(base_url=base, connection_timeout=args.vllm_server_timeout)
        generation.vllm_client = client
    return client


def run_engine(trainer: Any) -> Any:
    """The run's colocated vLLM engine (a ``vllm.LLM`` in this process), or None: the run generates
    with transformers or a server, or its engine is split over several processes by tensor
    parallelism (every rank of a group must then call it together)."""
    if not getattr(trainer, "use_vllm", False) or trainer.vllm_mode != "colocate":
        return None
    if trainer.args.vllm_tensor_parallel_size > 1:
        return None
    return trainer.vllm_generation.llm


def run_decoder(trainer: Any) -> EngineDecoder | ServerDecoder | None:
    """Greedy decoding by the run's vLLM engine or server, or None (see :func:`run_engine`)."""
    if getattr(trainer, "use_vllm", False) and trainer.vllm_mode == "server":
        return ServerDecoder(server_client(trainer))
    llm = run_engine(trainer)
    return EngineDecoder(llm) if llm is not None else None


@contextmanager
def colocated_engine_options(args: Any) -> Iterator[None]:
    """While TRL starts a colocated engine, give it the training's compute dtype and this machine's
    engine options (:func:`rredcot.lm.vllm_engine.engine_options`).

    TRL 1.16 builds that engine (``vllm.LLM`` in ``trl.generation.vllm_generation``) without a dtype,
    and vLLM's ``auto`` turns a float32 checkpoint into bfloat16: the engine would not hold the
    policy the trainer computes with (float32 on a CPU), and the greedy solutions it writes for the
    credit would not be the policy's. TRL offers no argument for either, so the module's ``LLM`` is
    given them for the duration of the trainer's set-up."""
    if not getattr(args, "use_vllm", False) or args.vllm_mode != "colocate":
        yield
        return
    from trl.generation import vllm_generation

    if not hasattr(vllm_generation, "LLM"):  # vLLM is not installed: TRL says so itself
        yield
        return
    dtype = "bfloat16" if args.bf16 else "float16" if args.fp16 else "float32"
    if not os.environ.get("MASTER_PORT"):
        # A colocated engine joins (or, alone, makes) the run's process group at MASTER_PORT, which
        # TRL sets to 29500 when that port is free: two runs starting at once on one machine both
        # take it, and the second fails (EADDRINUSE). An unused port the kernel hands out instead.
        os.environ["MASTER_PORT"] = str(_unused_port())
    original = vllm_generation.LLM
    vllm_generation.LLM = functools.partial(original, **{**engine_options(), "dtype": dtype})
    try:
        yield
    finally:
        vllm_generation.LLM = original


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def use_cpu_weight_sync(trainer: Any) -> None:
    """Give a run's colocated engine on a CPU a weight sync that reaches vLLM's packed kernels, and
    give the process's ``torch.set_num_threads`` back (the engine's CPU worker replaced it)."""
    generation = trainer.vllm_generation

    def sync_weights() -> None:
        accelerator = trainer.accelerator
        with whole_parameters(trainer.model_wrapped, backend_name(accelerator), accelerator) as model:
            load_weights(generation.llm, _checkpoint_tensors(model))

    generation.sync_weights = sync_weights
    restore_thread_control()


def _checkpoint_tensors(model: torch.nn.Module):  # noqa: ANN202
    for name, param in model.named_parameters():
        full = getattr(param, "full_tensor", None)  # a sharded (FSDP2) parameter made whole
        yield name, (full() if callable(full) else param).detach()
