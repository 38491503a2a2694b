"""RL training of one arm and seed: GRPO (uniform credit) or RREDCoT, through TRL.

CLI: ``python -m rredcot.stages.train --config C --arm rredcot --seed 0 --model SFT_DIR --data rl.clean.jsonl
--eval-data test.jsonl --out DIR``. Writes the trained model to ``DIR/model``, the learning curve
(held-out greedy accuracy vs step) to ``DIR/curve.csv`` and per-step training metrics to
``DIR/metrics.jsonl``; everything is logged to one MLflow run. Checkpoints every ``rl.save_every``
steps go to ``--checkpoint-dir``; a rerun after a crash resumes from the last one and continues the
MLflow run (:mod:`rredcot.infra.resume`, docs/resume.md).

``RREDCoTTrainer`` (in :mod:`rredcot.adapter.trainer`) is the library entry point for TRL users; this module
only wires the config to it.

Launched by ``rredcot launch`` (:mod:`rredcot.tools.launch`) through ``accelerate launch`` when the config
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
import logging
import math
import random
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from rredcot.adapter.distributed import process_state, save_model_whole
from rredcot.adapter.experiment import build_trainer
from rredcot.adapter.probe import probe_accuracy, probe_engine, probe_settings
from rredcot.adapter.trainer import RREDCoTTrainer
from rredcot.infra.io import atomic_path, read_jsonl
from rredcot.infra.logs import setup_logging
from rredcot.infra.resumable import resumable_job
from rredcot.infra.resume import RunLogger, StopOnSignal, checkpoint_step
from rredcot.lm.modeling import load_tokenizer, set_threads
from rredcot.lm.vllm_engine import prepare_engine
from rredcot.settings.config import ConfigError, arm_label, credit_settings
from rredcot.settings.reads import stage_config, stage_settings

_log = logging.getLogger(__name__)


class CurveCallback(RunLogger):
    """Logs trainer metrics to MLflow and probes held-out accuracy every ``every`` steps.

    Runs on every training process: the probe is split over them (:mod:`rredcot.adapter.probe`); the
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
            trainer.model_wrapped,
            self.tok,
            self.rows,
            self.prompt_cfg,
            self.probe,
            trainer.accelerator,
            engine=probe_engine(trainer),
        )
        self.curve.append({"step": step, **acc})
        self.log({f"heldout_{k}_accuracy": v for k, v in acc.items() if math.isfinite(v)}, step=step)
        if self.main:
            greedy = f"greedy {acc['greedy']:.3f} " if math.isfinite(acc["greedy"]) else ""
            _log.info(f"step {step}: held-out accuracy {greedy}sampled {acc['sampled']:.3f}")

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
        from rredcot.viz.credit_view import write_views

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
    """What a train job computes with: its checkpoints are only resumed under the same settings, the
    ones the rule's params hold (rredcot.settings.reads)."""
    return {"settings": stage_settings(cfg, "train", arm), "seed": seed}


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
    stop: StopOnSignal | None = None,
) -> dict[str, float]:
    """Train one arm/seed, checkpointing into ``checkpoints`` (resuming from ``resume_from`` if
    given); returns final summary metrics. ``run`` is the MLflow run on the main process, None on
    the others. ``stop`` (:func:`rredcot.infra.resume.stop_on_signal`) stops training at a
    checkpoint on SLURM's signal and raises :class:`rredcot.infra.resume.Preempted` before any
    output is written."""
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
    gpu = cfg["rl"]["gpu"]
    if gpu["use_vllm"] and gpu["vllm_mode"] == "colocate":
        # One engine per training process: vLLM installed, and on a CPU a head size it supports and
        # room for every process's KV cache, checked before the trainer starts it.
        prepare_engine(
            cfg["vllm_cpu"]["kv_cache_gib"],
            model_dir,
            "rl.gpu.use_vllm (colocate)",
            engines=process_state().num_processes,
        )
    # The start: a resumed Trainer loads the checkpoint's weights over it.
    callbacks = [callback, *([stop] if stop is not None else [])]
    trainer = build_trainer(cfg, arm, seed, model_dir, read_jsonl(data), checkpoints, callbacks)
    callback.trainer = trainer
    callback.views_dir = out / "credit"
    # The Trainer restores weights, optimizer, scheduler, RNG states and data position (docs/resume.md).
    trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    if stop is not None:
        stop.check()  # stopped on a signal: the checkpoint is saved, no output is written
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

    try:
        cfg = stage_config(args.config, "train", args.arm)
    except ConfigError as exc:
        raise SystemExit(str(exc)) from None
    set_threads(cfg["threads"]["train"])
    state = process_state()  # one process, or this job's share of an `accelerate launch`
    out = Path(args.out)
    checkpoints = Path(args.checkpoint_dir or default_checkpoint_dir(cfg, args.arm, args.seed))
    params = {
        "arm": cfg["arms"][args.arm],
        "rl": cfg["rl"],
        "credit": credit_settings(cfg, args.arm),
        "model_dtype": cfg["model"]["dtype"],
        "distributed": {**cfg["distributed"], "processes": state.num_processes},
        "seed": args.seed,
        "model": args.model,
        "data": args.data,
    }
    arm_cfg = cfg["arms"][args.arm]
    tags = {
        "rredcot.credit_method": arm_cfg["credit"],
        "rredcot.loss_type": arm_cfg["loss_type"],
        "rredcot.arm_label": arm_label(cfg, args.arm),
    }
    with resumable_job(
        cfg,
        state,
        checkpoints,
        job_settings(cfg, args.arm, args.seed),
        [args.model, args.data, args.eval_data],
        rule="train",
        name=f"train-{args.arm}-s{args.seed}",
        resume=cfg["rl"]["resume"],
        save_every=cfg["rl"]["save_every"],
        log=_log,
        tags=tags,
        arm=args.arm,
        seed=args.seed,
        params=params,
    ) as job:
        if state.is_main_process:
            out.mkdir(parents=True, exist_ok=True)
        summary = train(
            cfg,
            args.arm,
            args.seed,
            args.model,
            args.data,
            args.eval_data,
            out,
            job.run,
            checkpoints,
            job.resume_from,
            job.stop,
        )
        if state.is_main_process:
            job.run.log_metrics(summary)
            job.run.log_artifact(out / "curve.csv")
            job.run.log_artifact(out / "metrics.jsonl")
            _log.info(f"{args.arm} seed {args.seed}: {summary}")


if __name__ == "__main__":
    setup_logging()
    main()
