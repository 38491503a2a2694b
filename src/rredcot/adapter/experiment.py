"""An experiment config's training arm as a TRL trainer: GRPOConfig, precision, micro-batching.

The workflow's train stage, the cost benchmark and the tests build their trainers here, so the
mapping from the config to TRL is written once. Precision: float32 master weights and Adam states
always; with ``model.dtype`` bfloat16 the forward and backward run under autocast and the LM head's
log-softmax in float32 (``cast_lm_head_to_fp32``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from trl import GRPOConfig

from rredcot.adapter.distributed import process_state
from rredcot.adapter.trainer import RREDCoTTrainer
from rredcot.data.records import correctness_reward, rl_records, row_reward
from rredcot.data.synthetic import culprit_offset, exact_value_functions
from rredcot.infra.resume import SAVE_TOTAL_LIMIT
from rredcot.lm.modeling import load_tokenizer
from rredcot.settings.config import credit_config


def mixed_precision(cfg: Mapping[str, Any]) -> dict[str, bool]:
    """TrainingArguments precision flags: float32 master weights always; ``model.dtype`` is the
    autocast dtype of forward and backward (float32: none)."""
    dtype = cfg["model"]["dtype"]
    return {"bf16": dtype == "bfloat16", "fp16": dtype == "float16"}


def micro_batching(cfg: Mapping[str, Any], processes: int) -> tuple[int, int]:
    """(per-process micro-batch, gradient accumulation steps) for ``processes`` training processes.

    One optimizer step takes prompts_per_step x num_generations completions:
    micro-batch x processes x accumulation steps of them."""
    rl = cfg["rl"]
    batch = rl["prompts_per_step"] * rl["num_generations"]
    if batch % processes:
        raise ValueError(
            f"prompts_per_step x num_generations ({batch}) must split evenly over {processes} processes"
        )
    micro = rl["micro_batch_size"] or batch // processes
    if (batch // processes) % micro:
        raise ValueError(
            f"rl.micro_batch_size {micro} must divide the {batch // processes} completions each of "
            f"{processes} processes takes per step (prompts_per_step x num_generations = {batch})"
        )
    return micro, batch // processes // micro


def grpo_args(
    cfg: Mapping[str, Any], arm: str, seed: int, output_dir: str | Path, processes: int = 1
) -> GRPOConfig:
    """TRL GRPOConfig shared by every arm: only the credit method (and loss type) differ.

    ``rl.gpu.use_vllm`` generates with vLLM on GPUs and, with vLLM's CPU build, on a CPU (a colocated
    engine there; docs/vllm.md); gradient checkpointing applies only when CUDA is
    available. The micro-batch and gradient accumulation follow from ``rl.micro_batch_size`` and the
    number of training processes (:func:`micro_batching`).
    """
    rl = cfg["rl"]
    cuda = torch.cuda.is_available()
    gpu = rl["gpu"]
    micro, accumulate = micro_batching(cfg, processes)
    vllm = {}
    if gpu["use_vllm"]:
        vllm = {"use_vllm": True, "vllm_mode": gpu["vllm_mode"]}
        if gpu["vllm_mode"] == "colocate":
            vllm["vllm_gpu_memory_utilization"] = gpu["vllm_gpu_memory_utilization"]
            vllm["vllm_max_model_length"] = gpu["vllm_max_model_length"]
        else:  # the server `rredcot launch` started; it exports where it listens
            server = cfg["distributed"]["vllm_server"]
            vllm |= {
                "vllm_server_host": os.environ.get("RREDCOT_VLLM_HOST", "127.0.0.1"),
                "vllm_server_port": int(os.environ.get("RREDCOT_VLLM_PORT", server["port"])),
                "vllm_group_port": int(os.environ.get("RREDCOT_VLLM_GROUP_PORT", server["group_port"])),
                "vllm_server_timeout": float(server["startup_timeout"]),
            }
    precision = mixed_precision(cfg)
    return GRPOConfig(
        output_dir=str(output_dir),
        loss_type=cfg["arms"][arm]["loss_type"],  # TRL's default is dapo: always passed
        top_entropy_quantile=cfg["arms"][arm]["top_entropy_quantile"],
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=accumulate,
        num_generations=rl["num_generations"],
        max_completion_length=rl["max_completion_length"],
        temperature=rl["temperature"],
        top_k=0,
        learning_rate=rl["learning_rate"],
        lr_scheduler_type=rl["lr_scheduler"],
        warmup_steps=rl["warmup_steps"],
        max_steps=rl["max_steps"],
        beta=rl["beta"],
        epsilon=rl["epsilon"],
        num_iterations=rl["num_iterations"],
        logging_steps=1,
        save_strategy="steps" if rl["save_every"] else "no",
        save_steps=max(1, rl["save_every"]),
        save_total_limit=SAVE_TOTAL_LIMIT,
        report_to="none",
        **precision,
        # The policy's log-probabilities from a float32 head, as the credit passes compute theirs.
        cast_lm_head_to_fp32=precision["bf16"] or precision["fp16"],
        gradient_checkpointing=cuda and bool(gpu["gradient_checkpointing"]),
        use_cpu=not cuda,
        **({"use_vllm": False} | vllm),
        seed=seed,
        data_seed=seed,
        dataloader_num_workers=0,
        disable_tqdm=False,
    )


def build_trainer(
    cfg: Mapping[str, Any],
    arm: str,
    seed: int,
    model_dir: str,
    rows: list[dict],
    output_dir: str | Path,
    callbacks: Sequence[Any] = (),
    reward_funcs: Sequence[Any] = (correctness_reward,),
) -> RREDCoTTrainer:
    """The arm's RREDCoTTrainer on the start model in ``model_dir`` and the RL rows.

    The model is loaded by TRL from its path in float32 (``model_init_kwargs``), so that under ZeRO-3
    it is created sharded, and its reference model, if any, is built the same way.
    """
    tok = load_tokenizer(model_dir)
    train_ds = Dataset.from_list(rl_records(rows, cfg["prompt"], tok))
    args = grpo_args(cfg, arm, seed, output_dir, process_state().num_processes)
    # Master weights in float32 (autocast computes in model.dtype); accelerate places the model.
    args.model_init_kwargs = {"dtype": torch.float32, "device_map": None}
    credit = credit_config(cfg, arm)
    return RREDCoTTrainer(
        model=str(model_dir),
        reward_funcs=list(reward_funcs),
        args=args,
        train_dataset=train_ds,
        processing_class=tok,
        callbacks=list(callbacks),
        credit=credit,
        # Only the synthetic task knows where a trace goes wrong (it raises for any other problem).
        culprit=culprit_offset if "culprit" in credit.kind.needs else None,
        # Monte Carlo values score each rollout with the run's reward (the default one).
        rollout_reward=row_reward if "outcome" in credit.kind.needs else None,
        task_values=exact_value_functions if "task_values" in credit.kind.needs else None,
        sampling_seed=seed if cfg["rl"]["paired_sampling"] else None,
    )
