"""RL training of one arm and seed: GRPO (uniform credit) or RREDCoT, through TRL.

CLI: ``python -m rredcot.train --config C --arm rredcot --seed 0 --model SFT_DIR --data rl.clean.jsonl
--eval-data test.jsonl --out DIR``. Writes the trained model to ``DIR/model``, the learning curve
(held-out greedy accuracy vs step) to ``DIR/curve.csv`` and per-step training metrics to
``DIR/metrics.jsonl``; everything is logged to one MLflow run. Checkpoints every ``rl.save_every``
steps go to ``--checkpoint-dir``; a rerun after a crash resumes from the last one and continues the
MLflow run (:mod:`rredcot.resume`, docs/RESUME.md).

``RREDCoTTrainer`` (in :mod:`rredcot.trainer`) is the library entry point for TRL users; this module
only wires the config to it.

Launched by ``rredcot launch`` (:mod:`rredcot.launch`) through ``accelerate launch`` when the config
names an accelerate config: every process runs this module, and only the main process writes (the
MLflow run, checkpoint bookkeeping, metrics, credit pictures, the model and the curve); the probe is
split over all processes. Precision: float32 master weights and Adam states always; with
``model.dtype`` bfloat16 the forward and backward run under autocast and the LM head's log-softmax in
float32 (``cast_lm_head_to_fp32``).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import random
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from trl import GRPOConfig

from rredcot.config import arm_label, load_config
from rredcot.data import correctness_reward, rl_records
from rredcot.distributed import process_state, save_model_whole
from rredcot.jsonl import atomic_path, read_jsonl
from rredcot.modeling import load_tokenizer, set_threads
from rredcot.prefix_scoring import ScoringBudget
from rredcot.probe import probe_accuracy, probe_settings
from rredcot.resume import (
    SAVE_TOTAL_LIMIT,
    RunLogger,
    checkpoint_step,
    discard,
    fingerprint,
    prepare_shared,
    record,
)
from rredcot.segmentation import SegmentationConfig
from rredcot.trainer import CreditConfig, RREDCoTTrainer

SEGMENTATION_KEYS = (
    "keywords",
    "split_on_newline",
    "n_segments",
    "tokens_per_segment",
    "max_segments",
    "min_segment_tokens",
    "homogenize",
)
BUDGET_KEYS = ("max_batch_tokens", "max_mask_elements", "max_logit_elements")


def credit_config(cfg: Mapping[str, Any], arm: str) -> CreditConfig:
    """The CreditConfig of an arm: the ``credit`` section, the arm's ``credit_options`` and ``prompt``."""
    c = {**cfg["credit"], **cfg["arms"][arm].get("credit_options", {})}
    p = cfg["prompt"]
    seg = {k: c[k] for k in SEGMENTATION_KEYS if k in c}
    if "keywords" in seg:
        seg["keywords"] = tuple(seg["keywords"])
    return CreditConfig(
        method=cfg["arms"][arm]["credit"],
        mix=c["mix"],
        segmentation=SegmentationConfig(**seg),
        exit_string=p["exit_string"],
        answer_prefix=p["answer_prefix"],
        answer_suffix=p["answer_suffix"],
        group_pairs=c["group_pairs"],
        proposal=c["proposal"],
        value_model=c["value_model"],
        scorer=c["scorer"],
        answer_baseline=c["answer_baseline"],
        budget=ScoringBudget(**{k: c[k] for k in BUDGET_KEYS}),
        view_every=c["view_every"],
        view_samples=c["view_samples"],
    )


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

    ``rl.gpu`` settings (vLLM generation, gradient checkpointing) apply only when CUDA is available.
    The micro-batch and gradient accumulation follow from ``rl.micro_batch_size`` and the number of
    training processes (:func:`micro_batching`).
    """
    rl = cfg["rl"]
    cuda = torch.cuda.is_available()
    gpu = rl.get("gpu", {}) if cuda else {}
    micro, accumulate = micro_batching(cfg, processes)
    vllm = {}
    if gpu.get("use_vllm"):
        vllm = {"use_vllm": True, "vllm_mode": gpu["vllm_mode"]}
        if gpu["vllm_mode"] == "colocate":
            vllm["vllm_gpu_memory_utilization"] = gpu["vllm_gpu_memory_utilization"]
        else:  # the server `rredcot launch` started; it exports where it listens
            server = cfg["distributed"]["vllm_server"]
            vllm |= {
                "vllm_server_host": os.environ.get("RREDCOT_VLLM_HOST", "127.0.0.1"),
                "vllm_server_port": int(os.environ.get("RREDCOT_VLLM_PORT", server["port"])),
                "vllm_group_port": server["group_port"],
                "vllm_server_timeout": float(server["startup_timeout"]),
            }
    precision = mixed_precision(cfg)
    return GRPOConfig(
        output_dir=str(output_dir),
        loss_type=cfg["arms"][arm].get("loss_type", "grpo"),  # TRL's default is dapo: be explicit
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=accumulate,
        num_generations=rl["num_generations"],
        max_completion_length=rl["max_completion_length"],
        temperature=rl["temperature"],
        top_k=0,
        learning_rate=rl["learning_rate"],
        lr_scheduler_type=rl.get("lr_scheduler", "constant"),
        warmup_steps=rl.get("warmup_steps", 0),
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
        gradient_checkpointing=bool(gpu.get("gradient_checkpointing", False)),
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
    return RREDCoTTrainer(
        model=str(model_dir),
        reward_funcs=list(reward_funcs),
        args=args,
        train_dataset=train_ds,
        processing_class=tok,
        callbacks=list(callbacks),
        credit=credit_config(cfg, arm),
    )


class CurveCallback(RunLogger):
    """Logs trainer metrics to MLflow and probes held-out accuracy every ``every`` steps.

    Runs on every training process: the probe is split over them (:mod:`rredcot.probe`); the
    MLflow run, ``metrics.jsonl`` and the credit pictures belong to the main process (``run`` is None
    on the others). Its state (curve so far, step times) is saved in each checkpoint and restored on
    resume, and ``metrics.jsonl`` is rebuilt from the checkpoint's log history, so no step is lost or
    repeated.
    """

    def __init__(
        self,
        run: Any,
        tokenizer: Any,
        eval_rows: list[dict],
        prompt_cfg: Mapping[str, Any],
        every: int,
        probe: Mapping[str, Any],
        metrics_path: Path,
        hold: bool = False,
    ) -> None:
        super().__init__(run, hold)
        self.tok, self.rows, self.prompt_cfg = tokenizer, eval_rows, prompt_cfg
        self.every, self.probe = every, probe
        self.curve: list[dict[str, float]] = []
        self.metrics_path = metrics_path
        self.metrics_fh: Any = None  # opened when training begins, closed when it ends (main process)
        self.views_dir: Path | None = None  # where credit pictures go (set by train())
        self.trainer: RREDCoTTrainer | None = None
        self.step_seconds: list[float] = []
        self.seconds_before = 0.0  # training time of earlier attempts (resumed jobs)
        self.steps_done = 0  # optimizer steps of this attempt
        self._t_begin = time.time()
        self._step_t0 = 0.0
        self._views_done = 0

    @property
    def main(self) -> bool:
        return self.run is not None

    def _probe(self, step: int) -> None:
        if self.every <= 0:
            return
        trainer = self.trainer
        acc = probe_accuracy(
            trainer.model_wrapped, self.tok, self.rows, self.prompt_cfg, self.probe, trainer.accelerator
        )
        self.curve.append({"step": step, **acc})
        self.log({f"heldout_{k}_accuracy": v for k, v in acc.items() if math.isfinite(v)}, step=step)
        if self.main:
            greedy = f"greedy {acc['greedy']:.3f} " if math.isfinite(acc["greedy"]) else ""
            print(f"[train] step {step}: held-out accuracy {greedy}sampled {acc['sampled']:.3f}", flush=True)

    @property
    def seconds(self) -> float:
        """Training time so far, over all attempts."""
        return self.seconds_before + time.time() - self._t_begin

    def extra_state(self) -> dict[str, Any]:
        return {"curve": self.curve, "step_seconds": self.step_seconds, "seconds": self.seconds}

    def _open_metrics(self) -> None:
        if self.main:
            self.metrics_fh = open(self.metrics_path, "w")  # noqa: SIM115 - closed in on_train_end

    def started(self, state, model):  # noqa: ANN001
        self._t_begin = time.time()
        self._open_metrics()
        self._probe(0)

    def resumed(self, saved, state):  # noqa: ANN001
        # The step-0 probe and every step up to the checkpoint are done: take their results back.
        self._t_begin = time.time()
        self.curve = [dict(row) for row in saved["curve"]]
        self.step_seconds = list(saved["step_seconds"])
        self.seconds_before = float(saved["seconds"])
        self._open_metrics()
        for logs in state.log_history:
            self._write_metrics(logs["step"], logs)

    def on_step_begin(self, args, state, control, **kw):  # noqa: ANN001
        self._step_t0 = time.perf_counter()

    def on_step_end(self, args, state, control, model=None, **kw):  # noqa: ANN001
        # Generation, credit, loss and update: the probe below is not part of the step.
        seconds = time.perf_counter() - self._step_t0
        self.step_seconds.append(seconds)
        self.steps_done += 1
        self.log({"perf/step_seconds": seconds}, step=state.global_step)
        self._write_views()
        if self.every > 0 and (state.global_step % self.every == 0 or state.global_step == state.max_steps):
            self._probe(state.global_step)

    def _write_views(self) -> None:
        """Render the credit records the trainer kept since the last step and log them to MLflow."""
        from rredcot.credit_view import write_views

        views = self.trainer.credit_views if self.trainer is not None else []
        new = views[self._views_done :]
        if not self.main or not new or self.views_dir is None:
            return
        self._views_done = len(views)
        step = new[0]["step"]
        folder = self.views_dir / f"step{step:05d}"
        write_views(new, folder, stem="trace")
        self.run.log_artifacts(folder, artifact_path=f"credit/step{step:05d}")

    def _write_metrics(self, step: int, logs: Mapping[str, Any]) -> dict[str, float]:
        numeric = {k: float(v) for k, v in logs.items() if isinstance(v, int | float) and k != "step"}
        if self.metrics_fh is not None:
            self.metrics_fh.write(json.dumps({"step": step, **numeric}) + "\n")
            self.metrics_fh.flush()
        return numeric

    def on_log(self, args, state, control, logs=None, **kw):  # noqa: ANN001
        if logs:
            self.log(self._write_metrics(state.global_step, logs), step=state.global_step)

    def on_train_end(self, args, state, control, **kw):  # noqa: ANN001
        if self.metrics_fh is not None:
            self.metrics_fh.close()
        super().on_train_end(args, state, control, **kw)


def write_curve(path: Path, curve: list[dict[str, float]], arm: str, seed: int) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["arm", "seed", "step", "greedy", "sampled"])
        writer.writeheader()
        for row in curve:
            writer.writerow({"arm": arm, "seed": seed, **row})


def job_settings(cfg: Mapping[str, Any], arm: str, seed: int) -> dict[str, Any]:
    """Everything in the config that changes what a train job computes: its checkpoints are only
    resumed under the same settings (thread counts and the checkpoint interval don't count)."""
    rl = {k: v for k, v in cfg["rl"].items() if k not in ("save_every", "resume")}
    keys = ("credit", "prompt", "eval", "model")
    return {"arm": cfg["arms"][arm], "rl": rl, "seed": seed, **{k: cfg[k] for k in keys}}


def default_checkpoint_dir(cfg: Mapping[str, Any], arm: str, seed: int) -> Path:
    return Path(cfg["results_dir"]) / "checkpoints" / "train" / arm / f"seed{seed}"


def train(
    cfg: Mapping[str, Any],
    arm: str,
    seed: int,
    model_dir: str,
    data: str,
    eval_data: str,
    out: Path,
    run: Any,
    checkpoints: Path,
    resume_from: Path | None = None,
) -> dict[str, float]:
    """Train one arm/seed, checkpointing into ``checkpoints`` (resuming from ``resume_from`` if
    given); returns final summary metrics. ``run`` is the MLflow run on the main process, None on
    the others."""
    out.mkdir(parents=True, exist_ok=True)
    random.seed(seed)
    torch.manual_seed(seed)
    tok = load_tokenizer(model_dir)
    eval_rows = read_jsonl(eval_data)[: cfg["rl"]["eval_problems"]]
    callback = CurveCallback(
        run,
        tok,
        eval_rows,
        cfg["prompt"],  # the whole section: chat-style prompts need the tokenizer's template
        cfg["rl"]["eval_every"],
        probe_settings(cfg),
        out / "metrics.jsonl",
        hold=cfg["rl"]["save_every"] > 0,
    )
    # The start: a resumed Trainer loads the checkpoint's weights over it.
    trainer = build_trainer(cfg, arm, seed, model_dir, read_jsonl(data), checkpoints, [callback])
    callback.trainer = trainer
    callback.views_dir = out / "credit"
    # The Trainer restores weights, optimizer, scheduler, RNG states and data position (docs/RESUME.md).
    trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    # Outputs appear whole or not at all: a killed job never leaves one that looks finished.
    save_model_whole(trainer, tok, out / "model")
    if trainer.accelerator.is_main_process:
        write_curve(out / "curve.csv", callback.curve, arm, seed)
    final = callback.curve[-1] if callback.curve else {"greedy": math.nan, "sampled": math.nan}
    steps = sorted(callback.step_seconds)
    seconds = callback.seconds
    return {
        "train_seconds": seconds,
        "seconds_per_step": seconds / max(1, cfg["rl"]["max_steps"]),
        "median_step_seconds": steps[len(steps) // 2] if steps else float("nan"),
        "final_heldout_greedy_accuracy": final["greedy"],
        "final_heldout_sampled_accuracy": final["sampled"],
        "resumed_from_step": checkpoint_step(resume_from) if resume_from else 0,
        "steps_this_attempt": callback.steps_done,
        "processes": trainer.accelerator.num_processes,
    }


def main(argv: Sequence[str] | None = None) -> None:
    from rredcot.tracking import stage_run

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", nargs="+", required=True, help="config YAML file(s), later ones override")
    ap.add_argument("--arm", required=True, help="arm name from the config's arms section")
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--model", required=True, help="starting model directory (the SFT model)")
    ap.add_argument("--data", required=True, help="cleaned RL split (JSONL)")
    ap.add_argument("--eval-data", required=True, help="held-out split for the learning curve (JSONL)")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument(
        "--checkpoint-dir",
        help="checkpoints of this job, kept across crashes (<results_dir>/checkpoints/train/ARM/seedN)",
    )
    args = ap.parse_args(argv)

    cfg = load_config(args.config)
    if args.arm not in cfg["arms"]:
        raise SystemExit(f"unknown arm {args.arm!r}; configured arms: {', '.join(cfg['arms'])}")
    set_threads(cfg["threads"]["train"])
    state = process_state()  # one process, or this job's share of an `accelerate launch`
    main_process = state.is_main_process
    out = Path(args.out)
    checkpoints = Path(args.checkpoint_dir or default_checkpoint_dir(cfg, args.arm, args.seed))
    digest = fingerprint(job_settings(cfg, args.arm, args.seed), [args.model, args.data, args.eval_data])
    rl = cfg["rl"]
    # The main process decides where to start (it may delete stale checkpoints); the others follow.
    start = prepare_shared(state, checkpoints, digest, rl["resume"] and rl["save_every"] > 0, "train")
    if start.checkpoint and main_process:
        print(f"[train] resuming from {start.checkpoint.name}", flush=True)
    params = {
        "arm": cfg["arms"][args.arm],
        "rl": cfg["rl"],
        "credit": cfg["credit"],
        "model_dtype": cfg["model"]["dtype"],
        "distributed": {**cfg["distributed"], "processes": state.num_processes},
        "seed": args.seed,
        "model": args.model,
        "data": args.data,
    }
    arm_cfg = cfg["arms"][args.arm]
    tags = {
        "rredcot.credit_method": arm_cfg["credit"],
        "rredcot.loss_type": arm_cfg.get("loss_type", "grpo"),
        "rredcot.arm_label": arm_label(cfg, args.arm),
        **start.tags,
    }
    with stage_run(
        cfg,
        f"train-{args.arm}-s{args.seed}",
        rule="train",
        arm=args.arm,
        seed=args.seed,
        params=params,
        tags=tags,
        resume=start.run_id,
        active=main_process,
    ) as run:
        if main_process:
            out.mkdir(parents=True, exist_ok=True)
            if rl["save_every"] > 0:
                record(checkpoints, digest, run.run_id)
        summary = train(
            cfg,
            args.arm,
            args.seed,
            args.model,
            args.data,
            args.eval_data,
            out,
            run,
            checkpoints,
            start.checkpoint,
        )
        if main_process:
            run.log_metrics(summary)
            run.log_artifact(out / "curve.csv")
            run.log_artifact(out / "metrics.jsonl")
            print(f"[train] {args.arm} seed {args.seed}: {summary}")
    state.wait_for_everyone()
    if main_process:
        discard(checkpoints)  # only now: a kill before this point resumes at the last step


if __name__ == "__main__":
    main()
