"""Checks of a whole configuration against the machine, before any job runs (the workflow calls
:func:`check_model_source` and :func:`check_vllm` when it starts).

A pretrained model from a GGUF file (``model.gguf``) needs its package and the ``gguf`` reader
installed (:func:`check_model_source`). A config that generates with vLLM (``eval.backend``,
``studies.backend``, ``rl.gpu.use_vllm``) needs vLLM installed; where the jobs run here without
CUDA, also a model whose attention heads vLLM's CPU backend supports, host memory for an engine's KV
cache, and a colocated engine (TRL pushes weights to a server over NCCL, which needs CUDA).
Each problem is named with its fix. The jobs check again when they start an engine
(:func:`rredcot.lm.vllm_engine.prepare_engine`), since a cluster job may run on another machine than
the one that submits it. A ``model.dtype`` of bfloat16 on a CPU that has no bfloat16 instructions is
a warning (:func:`cpu_dtype_warning`): it runs, many times slower than float32.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rredcot.lm import vllm_engine as V
from rredcot.settings.config import ConfigError, pretrained_path


def vllm_users(cfg: Mapping[str, Any]) -> list[str]:
    """The settings of ``cfg`` that ask for vLLM."""
    asks = {
        "eval.backend: vllm": cfg["eval"]["backend"] == "vllm",
        "studies.backend: vllm": cfg["studies"]["backend"] == "vllm",
        "rl.gpu.use_vllm: true": bool(cfg["rl"]["gpu"]["use_vllm"]),
    }
    return [name for name, on in asks.items() if on]


def vllm_problems(cfg: Mapping[str, Any], cuda: bool, local: bool) -> list[str]:
    """What keeps ``cfg``'s vLLM stages from running; ``cuda``: whether this machine has CUDA;
    ``local``: whether the jobs run on this machine."""
    users = vllm_users(cfg)
    if not users:
        return []
    problems = []
    try:
        V.require_vllm(", ".join(users), cuda)
    except V.VLLMSetupError as exc:
        problems.append(str(exc))
    if cuda or not local:
        return problems
    model = cfg["model"]
    size = None
    if model["kind"] == "scratch":
        size = V.head_size(model["hidden_size"], model["num_heads"])
    elif (Path(pretrained_path(cfg)) / "config.json").is_file():
        size = V.model_head_size(pretrained_path(cfg))
    if size is not None:
        try:
            V.check_cpu_head_size(size, f"{', '.join(users)} on this CPU: the model")
        except V.VLLMSetupError as exc:
            problems.append(str(exc))
    try:
        V.check_kv_memory(cfg["vllm_cpu"]["kv_cache_gib"])
    except V.VLLMSetupError as exc:
        problems.append(str(exc))
    gpu = cfg["rl"]["gpu"]
    if gpu["use_vllm"] and gpu["vllm_mode"] == "server":
        problems.append(
            "rl.gpu.vllm_mode: server on a machine without CUDA: TRL pushes the policy's weights to a "
            "vLLM server over NCCL, which needs CUDA, so the server could not follow the policy. Use "
            "vllm_mode: colocate here (an engine in each training process)."
        )
    return problems


def check_vllm(cfg: Mapping[str, Any], cuda: bool, local: bool) -> None:
    """Raise :class:`ConfigError` listing every problem of :func:`vllm_problems`."""
    problems = vllm_problems(cfg, cuda, local)
    if problems:
        raise ConfigError(
            "this configuration cannot run its vLLM stages here:\n  - " + "\n  - ".join(problems)
        )


def check_model_source(cfg: Mapping[str, Any]) -> None:
    """Raise :class:`ConfigError` naming the install command when the package that holds
    ``model.gguf``'s file, or the ``gguf`` reader, is missing; nothing to check for other models."""
    from rredcot.lm.gguf import ModelSourceError, locate_gguf, require_gguf_reader

    source = cfg["model"]["gguf"]
    if cfg["model"]["kind"] != "pretrained" or source is None:
        return
    if (Path(pretrained_path(cfg)) / "config.json").is_file():
        return  # converted already: neither is read again
    try:
        locate_gguf(source["package"], source["file"])
        require_gguf_reader()
    except ModelSourceError as exc:
        raise ConfigError(f"this configuration cannot convert its model here: {exc}") from None


def cpu_has_bfloat16() -> bool:
    """Whether this CPU computes bfloat16 matrix products in hardware (AVX-512 BF16 or AMX). torch
    has no public query for it; its ``torch.cpu`` helpers are the ones its own kernels dispatch on."""
    import torch  # here, not at import: the workflow reads this module on every dry run

    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in checks)


def cpu_dtype_warning(cfg: Mapping[str, Any], cuda: bool, local: bool, native: bool) -> str | None:
    """What to tell a user whose ``model.dtype`` is bfloat16 where the jobs run here on a CPU
    without bfloat16 instructions (``native``: :func:`cpu_has_bfloat16`); None otherwise. Without
    them torch multiplies bfloat16 matrices with a scalar fallback on one thread: on a 2-core AVX2 CPU
    an SFT step of config/smollm2.yaml had not finished after 6 minutes, against 40 s in float32
    (docs/models.md, "Training a pretrained model on a CPU")."""
    if cuda or not local or native or cfg["model"]["dtype"] != "bfloat16":
        return None
    return (
        "model.dtype: bfloat16 on a CPU without bfloat16 instructions (AVX-512 BF16 or AMX): torch "
        "emulates its matrix products, many times slower than float32. To compute here in float32, "
        "add config/cpu-float32.yaml (`model: {dtype: float32}`) after the other config files (its "
        "numbers then differ from a bfloat16 run's)."
    )
