"""RL training of one arm and seed: GRPO (uniform credit) or RREDCoT, through TRL.

CLI: ``python -m rredcot.train --config C --arm rredcot --seed 0 --model SFT_DIR --data rl.clean.jsonl
--eval-data test.jsonl --out DIR``. Writes the trained model to ``DIR/model``, the learning curve
(held-out greedy accuracy vs step) to ``DIR/curve.csv`` and per-step training metrics to
``DIR/metrics.jsonl``; everything is logged to one MLflow run. Checkpoints every ``rl.save_every``
steps go to ``--checkpoint-dir``; a rerun after a crash resumes from the last one and continues the
MLflow run (:mod:`rredcot.resume`, docs/RESUME.md).

``RREDCoTTrainer`` (in :mod:`rredcot.trainer`) is the library entry point for TRL users; this module
only wires the config to it.
"""

from __future__ import annotations

import argparse
import csv
import json
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
from rredcot.evaluate import probe_accuracy
from rredcot.jsonl import atomic_dir, atomic_path, read_jsonl
from rredcot.modeling import load_model, load_tokenizer, set_threads
from rredcot.prefix_scoring import ScoringBudget
from rredcot.resume import SAVE_TOTAL_LIMIT, RunLogger, checkpoint_step, discard, fingerprint, prepare, record
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


def grpo_args(cfg: Mapping[str, Any], arm: str, seed: int, output_dir: str | Path) -> GRPOConfig:
    """TRL GRPOConfig shared by every arm: only the credit method (and loss type) differ.

    ``rl.gpu`` settings (bf16, vLLM generation, gradient accumulation and checkpointing) apply only
    when CUDA is available; on a CPU the same config trains in float32 with transformers generation.
    """
    rl = cfg["rl"]
    cuda = torch.cuda.is_available()
    gpu = rl.get("gpu", {}) if cuda else {}
    batch = rl["prompts_per_step"] * rl["num_generations"]
    accumulate = gpu.get("gradient_accumulation_steps", 1)
    if batch % accumulate:
        raise ValueError(
            f"rl.gpu.gradient_accumulation_steps ({accumulate}) must divide prompts_per_step x "
            f"num_generations ({batch})"
        )
    vllm = {}
    if gpu.get("use_vllm"):
        vllm = {
            "use_vllm": True,
            "vllm_mode": gpu["vllm_mode"],
            "vllm_gpu_memory_utilization": gpu["vllm_gpu_memory_utilization"],
        }
    return GRPOConfig(
        output_dir=str(output_dir),
        loss_type=cfg["arms"][arm].get("loss_type", "grpo"),  # TRL's default is dapo: be explicit
        per_device_train_batch_size=batch // accumulate,
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
        bf16=bool(gpu.get("bf16", False)),
        gradient_checkpointing=bool(gpu.get("gradient_checkpointing", False)),
        use_cpu=not cuda,
        **({"use_vllm": False} | vllm),
        seed=seed,
        data_seed=seed,
        dataloader_num_workers=0,
        disable_tqdm=False,
    )


class CurveCallback(RunLogger):
    """Logs trainer metrics to MLflow and probes held-out greedy accuracy every ``every`` steps.

    Its state (curve so far, step times) is saved in each checkpoint and restored on resume, and
    ``metrics.jsonl`` is rebuilt from the checkpoint's log history, so no step is lost or repeated.
    """

    def __init__(
        self,
        run: Any,
        tokenizer: Any,
        eval_rows: list[dict],
        template: str | Mapping[str, Any],
        every: int,
        eval_cfg: Mapping[str, Any],
        metrics_path: Path,
        hold: bool = False,
    ) -> None:
        super().__init__(run, hold)
        self.tok, self.rows, self.template = tokenizer, eval_rows, template
        self.every, self.eval_cfg = every, eval_cfg
        self.curve: list[dict[str, float]] = []
        self.metrics_path = metrics_path
        self.metrics_fh: Any = None  # opened when training begins, closed when it ends
        self.views_dir: Path | None = None  # where credit pictures go (set by train())
        self.trainer: RREDCoTTrainer | None = None
        self.step_seconds: list[float] = []
        self.seconds_before = 0.0  # training time of earlier attempts (resumed jobs)
        self.steps_done = 0  # optimizer steps of this attempt
        self._t_begin = time.time()
        self._step_t0 = 0.0
        self._views_done = 0

    def _probe(self, model: torch.nn.Module, step: int) -> None:
        acc = probe_accuracy(model, self.tok, self.rows, self.template, self.eval_cfg)
        self.curve.append({"step": step, **acc})
        self.log({f"heldout_{k}_accuracy": v for k, v in acc.items()}, step=step)
        print(
            f"[train] step {step}: held-out accuracy greedy {acc['greedy']:.3f} sampled {acc['sampled']:.3f}",
            flush=True,
        )

    @property
    def seconds(self) -> float:
        """Training time so far, over all attempts."""
        return self.seconds_before + time.time() - self._t_begin

    def extra_state(self) -> dict[str, Any]:
        return {"curve": self.curve, "step_seconds": self.step_seconds, "seconds": self.seconds}

    def started(self, state, model):  # noqa: ANN001
        self._t_begin = time.time()
        self.metrics_fh = open(self.metrics_path, "w")  # noqa: SIM115 - closed in on_train_end
        self._probe(model, 0)

    def resumed(self, saved, state):  # noqa: ANN001
        # The step-0 probe and every step up to the checkpoint are done: take their results back.
        self._t_begin = time.time()
        self.curve = [dict(row) for row in saved["curve"]]
        self.step_seconds = list(saved["step_seconds"])
        self.seconds_before = float(saved["seconds"])
        self.metrics_fh = open(self.metrics_path, "w")  # noqa: SIM115 - closed in on_train_end
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
        if state.global_step % self.every == 0 or state.global_step == state.max_steps:
            self._probe(model, state.global_step)

    def _write_views(self) -> None:
        """Render the credit records the trainer kept since the last step and log them to MLflow."""
        from rredcot.credit_view import write_views

        views = self.trainer.credit_views if self.trainer is not None else []
        new = views[self._views_done :]
        if not new or self.views_dir is None:
            return
        self._views_done = len(views)
        step = new[0]["step"]
        folder = self.views_dir / f"step{step:05d}"
        write_views(new, folder, stem="trace")
        self.run.log_artifacts(folder, artifact_path=f"credit/step{step:05d}")

    def _write_metrics(self, step: int, logs: Mapping[str, Any]) -> dict[str, float]:
        numeric = {k: float(v) for k, v in logs.items() if isinstance(v, int | float) and k != "step"}
        self.metrics_fh.write(json.dumps({"step": step, **numeric}) + "\n")
        self.metrics_fh.flush()
        return numeric

    def on_log(self, args, state, control, logs=None, **kw):  # noqa: ANN001
        if logs:
            self.log(self._write_metrics(state.global_step, logs), step=state.global_step)

    def on_train_end(self, args, state, control, **kw):  # noqa: ANN001
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
    keys = ("credit", "prompt", "eval")
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
    given); returns final summary metrics."""
    out.mkdir(parents=True, exist_ok=True)
    random.seed(seed)
    torch.manual_seed(seed)
    tok = load_tokenizer(model_dir)
    # The start: a resumed Trainer loads the checkpoint's weights over it.
    model = load_model(model_dir, cfg["model"].get("dtype", "float32"))
    template = cfg["prompt"]  # the whole section: chat-style prompts need the tokenizer's template
    train_ds = Dataset.from_list(rl_records(read_jsonl(data), template, tok))
    eval_rows = read_jsonl(eval_data)[: cfg["rl"]["eval_problems"]]
    callback = CurveCallback(
        run,
        tok,
        eval_rows,
        template,
        cfg["rl"]["eval_every"],
        cfg["eval"],
        out / "metrics.jsonl",
        hold=cfg["rl"]["save_every"] > 0,
    )
    trainer = RREDCoTTrainer(
        model=model,
        reward_funcs=[correctness_reward],
        args=grpo_args(cfg, arm, seed, checkpoints),
        train_dataset=train_ds,
        processing_class=tok,
        callbacks=[callback],
        credit=credit_config(cfg, arm),
    )
    callback.trainer = trainer
    callback.views_dir = out / "credit"
    # The Trainer restores weights, optimizer, scheduler, RNG states and data position (docs/RESUME.md).
    trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    # Outputs appear whole or not at all: a killed job never leaves one that looks finished.
    with atomic_dir(out / "model") as tmp:
        trainer.model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
    write_curve(out / "curve.csv", callback.curve, arm, seed)
    final = callback.curve[-1]
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
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    checkpoints = Path(args.checkpoint_dir or default_checkpoint_dir(cfg, args.arm, args.seed))
    digest = fingerprint(job_settings(cfg, args.arm, args.seed), [args.model, args.data, args.eval_data])
    rl = cfg["rl"]
    start = prepare(checkpoints, digest, rl["resume"] and rl["save_every"] > 0, "train")
    if start.checkpoint:
        print(f"[train] resuming from {start.checkpoint.name}", flush=True)
    params = {
        "arm": cfg["arms"][args.arm],
        "rl": cfg["rl"],
        "credit": cfg["credit"],
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
    ) as run:
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
        run.log_metrics(summary)
        run.log_artifact(out / "curve.csv")
        run.log_artifact(out / "metrics.jsonl")
        print(f"[train] {args.arm} seed {args.seed}: {summary}")
    discard(checkpoints)  # only now: a kill before this point resumes at the last step


if __name__ == "__main__":
    main()
