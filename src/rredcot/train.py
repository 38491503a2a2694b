"""RL training of one arm and seed: GRPO (uniform credit) or RREDCoT, through TRL.

CLI: ``python -m rredcot.train --config C --arm rredcot --seed 0 --model SFT_DIR --data rl.clean.jsonl
--eval-data test.jsonl --out DIR``. Writes the trained model to ``DIR/model``, the learning curve
(held-out greedy accuracy vs step) to ``DIR/curve.csv`` and per-step training metrics to
``DIR/metrics.jsonl``; everything is logged to one MLflow run.

``RREDCoTTrainer`` (in :mod:`rredcot.trainer`) is the library entry point for TRL users; this module
only wires the config to it.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOConfig

from rredcot.config import arm_label, load_config
from rredcot.data import correctness_reward, rl_records
from rredcot.evaluate import probe_accuracy
from rredcot.jsonl import atomic_dir, atomic_path, read_jsonl
from rredcot.modeling import load_model, load_tokenizer, set_threads
from rredcot.prefix_scoring import ScoringBudget
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
        budget=ScoringBudget(**{k: c[k] for k in BUDGET_KEYS}),
        view_every=c["view_every"],
        view_samples=c["view_samples"],
    )


def grpo_args(cfg: Mapping[str, Any], arm: str, seed: int, output_dir: str | Path) -> GRPOConfig:
    """TRL GRPOConfig shared by every arm: only the credit method (and loss type) differ."""
    rl = cfg["rl"]
    return GRPOConfig(
        output_dir=str(output_dir),
        loss_type=cfg["arms"][arm].get("loss_type", "grpo"),  # TRL's default is dapo: be explicit
        per_device_train_batch_size=rl["prompts_per_step"] * rl["num_generations"],
        num_generations=rl["num_generations"],
        max_completion_length=rl["max_completion_length"],
        temperature=rl["temperature"],
        top_k=0,
        learning_rate=rl["learning_rate"],
        lr_scheduler_type="constant",
        max_steps=rl["max_steps"],
        beta=rl["beta"],
        epsilon=rl["epsilon"],
        num_iterations=rl["num_iterations"],
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        bf16=False,
        use_cpu=not torch.cuda.is_available(),
        use_vllm=False,
        seed=seed,
        data_seed=seed,
        dataloader_num_workers=0,
        disable_tqdm=False,
    )


class CurveCallback(TrainerCallback):
    """Logs trainer metrics to MLflow and probes held-out greedy accuracy every ``every`` steps."""

    def __init__(
        self,
        run: Any,
        tokenizer: Any,
        eval_rows: list[dict],
        template: str,
        every: int,
        eval_cfg: Mapping[str, Any],
        metrics_path: Path,
    ) -> None:
        self.run, self.tok, self.rows, self.template = run, tokenizer, eval_rows, template
        self.every, self.eval_cfg = every, eval_cfg
        self.curve: list[dict[str, float]] = []
        self.metrics_fh = open(metrics_path, "w")  # noqa: SIM115 - closed in on_train_end
        self.views_dir: Path | None = None  # where credit pictures go (set by train())
        self.trainer: RREDCoTTrainer | None = None
        self.step_seconds: list[float] = []
        self._step_t0 = 0.0
        self._views_done = 0

    def _probe(self, model: torch.nn.Module, step: int) -> None:
        acc = probe_accuracy(model, self.tok, self.rows, self.template, self.eval_cfg)
        self.curve.append({"step": step, **acc})
        self.run.log_metrics({f"heldout_{k}_accuracy": v for k, v in acc.items()}, step=step)
        print(
            f"[train] step {step}: held-out accuracy greedy {acc['greedy']:.3f} sampled {acc['sampled']:.3f}",
            flush=True,
        )

    def on_train_begin(self, args, state, control, model=None, **kw):  # noqa: ANN001
        self._probe(model, 0)

    def on_step_begin(self, args, state, control, **kw):  # noqa: ANN001
        self._step_t0 = time.perf_counter()

    def on_step_end(self, args, state, control, model=None, **kw):  # noqa: ANN001
        # Generation, credit, loss and update: the probe below is not part of the step.
        seconds = time.perf_counter() - self._step_t0
        self.step_seconds.append(seconds)
        self.run.log_metrics({"perf/step_seconds": seconds}, step=state.global_step)
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

    def on_log(self, args, state, control, logs=None, **kw):  # noqa: ANN001
        if logs:
            numeric = {k: float(v) for k, v in logs.items() if isinstance(v, int | float)}
            self.run.log_metrics(numeric, step=state.global_step)
            self.metrics_fh.write(json.dumps({"step": state.global_step, **numeric}) + "\n")
            self.metrics_fh.flush()

    def on_train_end(self, args, state, control, **kw):  # noqa: ANN001
        self.metrics_fh.close()


def write_curve(path: Path, curve: list[dict[str, float]], arm: str, seed: int) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["arm", "seed", "step", "greedy", "sampled"])
        writer.writeheader()
        for row in curve:
            writer.writerow({"arm": arm, "seed": seed, **row})


def train(
    cfg: Mapping[str, Any],
    arm: str,
    seed: int,
    model_dir: str,
    data: str,
    eval_data: str,
    out: Path,
    run: Any,
) -> dict[str, float]:
    """Train one arm/seed; returns final summary metrics."""
    out.mkdir(parents=True, exist_ok=True)
    random.seed(seed)
    torch.manual_seed(seed)
    tok = load_tokenizer(model_dir)
    model = load_model(model_dir)
    template = cfg["prompt"]["template"]
    train_ds = Dataset.from_list(rl_records(read_jsonl(data), template))
    eval_rows = read_jsonl(eval_data)[: cfg["rl"]["eval_problems"]]
    work = out / "trainer"
    callback = CurveCallback(
        run, tok, eval_rows, template, cfg["rl"]["eval_every"], cfg["eval"], out / "metrics.jsonl"
    )
    trainer = RREDCoTTrainer(
        model=model,
        reward_funcs=[correctness_reward],
        args=grpo_args(cfg, arm, seed, work),
        train_dataset=train_ds,
        processing_class=tok,
        callbacks=[callback],
        credit=credit_config(cfg, arm),
    )
    callback.trainer = trainer
    callback.views_dir = out / "credit"
    t0 = time.time()
    trainer.train()
    seconds = time.time() - t0
    with atomic_dir(out / "model") as tmp:
        trainer.model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
    write_curve(out / "curve.csv", callback.curve, arm, seed)
    shutil.rmtree(work, ignore_errors=True)
    final = callback.curve[-1]
    steps = sorted(callback.step_seconds)
    return {
        "train_seconds": seconds,
        "seconds_per_step": seconds / max(1, cfg["rl"]["max_steps"]),
        "median_step_seconds": steps[len(steps) // 2] if steps else float("nan"),
        "final_heldout_greedy_accuracy": final["greedy"],
        "final_heldout_sampled_accuracy": final["sampled"],
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
    args = ap.parse_args(argv)

    cfg = load_config(args.config)
    if args.arm not in cfg["arms"]:
        raise SystemExit(f"unknown arm {args.arm!r}; configured arms: {', '.join(cfg['arms'])}")
    set_threads(cfg["threads"]["train"])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
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
    }
    with stage_run(
        cfg,
        f"train-{args.arm}-s{args.seed}",
        rule="train",
        arm=args.arm,
        seed=args.seed,
        params=params,
        tags=tags,
    ) as run:
        summary = train(cfg, args.arm, args.seed, args.model, args.data, args.eval_data, out, run)
        run.log_metrics(summary)
        run.log_artifact(out / "curve.csv")
        run.log_artifact(out / "metrics.jsonl")
        print(f"[train] {args.arm} seed {args.seed}: {summary}")


if __name__ == "__main__":
    main()
