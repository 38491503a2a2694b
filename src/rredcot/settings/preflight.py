"""Checks of a whole configuration against the machine, before any job runs (the workflow calls
:func:`check_vllm` when it reads its config).

A config that generates with vLLM (``eval.backend``, ``studies.backend``, ``rl.gpu.use_vllm``) needs
vLLM installed; where the jobs run here without CUDA, also a model whose attention heads vLLM's CPU
backend supports, host memory for an engine's KV cache, and a colocated engine (TRL pushes weights to
a server over NCCL, which needs CUDA). Each problem is named with its fix. The jobs check again when
they start an engine (:func:`rredcot.lm.vllm_engine.prepare_engine`), since a cluster job may run
on another machine than the one that submits it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rredcot.lm import vllm_engine as V
from rredcot.settings.config import ConfigError


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
    elif model["name_or_path"] and (Path(model["name_or_path"]) / "config.json").is_file():
        size = V.model_head_size(model["name_or_path"])
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
