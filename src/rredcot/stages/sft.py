"""SFT warm-up: the starting policy for every RL arm.

For ``model.kind: scratch`` a byte-level BPE tokenizer is trained on the SFT split and a small Qwen2
model is initialised; for ``pretrained`` the checkpoint named in the config is loaded (a hub id, a
local directory, or the model stage's conversion of ``model.gguf``), and the prompts are written as
RL and evaluation write them (in the tokenizer's chat template with ``prompt.style: chat``). Either way
TRL's SFTTrainer fits the teacher completions (loss on completion tokens only) and the result is
saved with ``save_pretrained``. Checkpoints every ``sft.save_every`` steps go to
``--checkpoint-dir``; a rerun after a crash resumes from the last one (docs/resume.md).

Launched by ``rredcot launch sft`` (one process, or ``accelerate launch`` with the config's
``distributed`` settings); only the main process writes. Float32 master weights; ``model.dtype``
bfloat16 trains under autocast.

CLI: ``python -m rredcot.stages.sft --config C --data sft.jsonl --out results/models/sft``.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from trl import SFTConfig, SFTTrainer

from rredcot.adapter.distributed import process_state, save_model_whole
from rredcot.data.records import sft_records
from rredcot.infra.io import read_jsonl
from rredcot.infra.logs import setup_logging
from rredcot.infra.resumable import resumable_job
from rredcot.infra.resume import SAVE_TOTAL_LIMIT, RunLogger, StopOnSignal, checkpoint_step
from rredcot.lm.modeling import (
    build_scratch_model,
    load_model,
    load_tokenizer,
    set_threads,
    sft_attention,
    train_tokenizer,
)
from rredcot.settings.config import pretrained_path
from rredcot.settings.reads import stage_config, stage_settings

_log = logging.getLogger(__name__)


class MetricsCallback(RunLogger):
    """Forwards the trainer's logged numbers to the job's MLflow run (in step with the checkpoints)."""

    def on_log(self, args, state, control, logs=None, **kw):  # noqa: ANN001
        if logs:
            self.log({k: float(v) for k, v in logs.items() if isinstance(v, int | float)}, state.global_step)


def build_start(cfg: Mapping[str, Any], rows: list[dict], resume_from: Path | None = None) -> tuple[Any, Any]:
    """Tokenizer and untrained (or pretrained) model for SFT.

    A resumed job takes the tokenizer it trained before from the checkpoint rather than training it
    again; the Trainer then loads the checkpoint's weights over the model."""
    spec = cfg["model"]
    attention = sft_attention(spec, cfg["sft"]["attn_implementation"])
    if spec["kind"] == "pretrained":  # float32 master weights; autocast computes in model.dtype
        path = pretrained_path(cfg)
        return load_tokenizer(path), load_model(path, "float32", attention)
    if resume_from is not None:
        tok = load_tokenizer(resume_from)
    else:
        # The tokenizer learns from exactly the texts SFT trains on (prompt, given thinking, completion).
        records = sft_records(rows, cfg["prompt"], eos="")
        tok = train_tokenizer([r["prompt"] + r["completion"] for r in records], spec["vocab_size"])
    return tok, build_scratch_model(tok, spec, cfg["sft"]["seed"], attention)


class FullLogitsSFTTrainer(SFTTrainer):
    """TRL's SFTTrainer with the loss read off the model's whole logits (``sft.loss_logits: full``).

    TRL computes the completion tokens' log-probabilities with its fused LM head, in tiles that never
    hold the whole logits; without Triton (on a CPU) the tiles are folded by torch operations, which
    for SmolLM2's 49,152-token vocabulary took about as long as the rest of an SFT step. This is the
    same loss (the mean negative log-likelihood of the completion tokens, normalised as TRL
    normalises it) from one log-softmax over the whole logits."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):  # noqa: ANN001
        model_inputs = {
            k: v for k, v in inputs.items() if k in ("input_ids", "attention_mask", "position_ids")
        }
        outputs = model(**model_inputs)
        targets = inputs["labels"][:, 1:]
        logits = outputs.logits[:, :-1].float()
        nll = torch.nn.functional.cross_entropy(
            logits.transpose(1, 2), targets, ignore_index=-100, reduction="sum"
        )
        mask = targets != -100
        tokens = mask.sum()
        loss = nll / torch.as_tensor(tokens if num_items_in_batch is None else num_items_in_batch).clamp(
            min=1
        )
        if self.args.average_tokens_across_devices and num_items_in_batch is not None:
            loss = loss * self.accelerator.num_processes
        with torch.no_grad():
            correct = (logits.argmax(dim=-1) == targets) & mask
            counts = self.accelerator.gather_for_metrics(torch.stack([tokens, correct.sum()]).view(1, 2)).sum(
                0
            )
        mode = "train" if model.training else "eval"
        self._metrics[mode]["mean_token_accuracy"].append(float(counts[1] / counts[0].clamp(min=1)))
        return (loss, outputs) if return_outputs else loss


def mean_loss(training_loss: float, state: Any, resumed_step: int) -> float:
    """Mean training loss per step, also for a resumed job.

    The Trainer divides the loss summed in this attempt by all steps. On resume add the losses the
    earlier attempt logged up to the checkpoint and divide by the steps they cover (steps after its
    last log are lost with the killed process)."""
    if not resumed_step:
        return training_loss
    total, covered = training_loss * state.global_step, 0
    for logs in state.log_history:
        if "loss" in logs and logs["step"] <= resumed_step:
            total += logs["loss"] * (logs["step"] - covered)
            covered = logs["step"]
    return total / max(1, covered + state.global_step - resumed_step)


def job_settings(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """What changes the SFT result, the rule's params (rredcot.settings.reads): checkpoints are resumed
    only under the same settings."""
    return stage_settings(cfg, "sft")


def build_sft_trainer(
    cfg: Mapping[str, Any],
    rows: list[dict],
    checkpoints: Path,
    callbacks: Sequence[Any] = (),
    resume_from: Path | None = None,
    max_steps: int = -1,
    start: tuple[Any, Any] | None = None,
) -> SFTTrainer:
    """TRL's SFTTrainer on the SFT rows with the config's settings. ``max_steps`` > 0 stops early and
    ``start`` (tokenizer, model) replaces :func:`build_start`: ``scripts/sft-attention.py`` times a
    few hundred steps of a fresh or a trained model."""
    tok, model = start or build_start(cfg, rows, resume_from)
    tok.padding_side = "right"  # training pads on the right; generation switches to left
    records = sft_records(rows, cfg["prompt"], tok.eos_token, tok)
    s = cfg["sft"]
    args = SFTConfig(
        output_dir=str(checkpoints),
        per_device_train_batch_size=s["batch_size"],
        num_train_epochs=s["epochs"],
        max_steps=max_steps,
        learning_rate=s["learning_rate"],
        lr_scheduler_type="cosine",
        warmup_steps=s["warmup_steps"],
        weight_decay=s["weight_decay"],
        adam_beta2=s["adam_beta2"],
        gradient_checkpointing=s["gradient_checkpointing"],
        max_length=s["max_length"],
        train_sampling_strategy="group_by_length" if s["group_by_length"] else "random",
        logging_steps=25,
        save_strategy="steps" if s["save_every"] else "no",
        save_steps=max(1, s["save_every"]),
        save_total_limit=SAVE_TOTAL_LIMIT,
        report_to="none",
        bf16=cfg["model"]["dtype"] == "bfloat16",
        fp16=cfg["model"]["dtype"] == "float16",
        use_cpu=not torch.cuda.is_available(),
        seed=s["seed"],
        dataloader_num_workers=0,
    )
    trainer_class = FullLogitsSFTTrainer if s["loss_logits"] == "full" else SFTTrainer
    return trainer_class(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(records),
        processing_class=tok,
        callbacks=list(callbacks),
    )


def run_sft(
    cfg: Mapping[str, Any],
    data: str,
    out: Path,
    run: Any,
    checkpoints: Path,
    resume_from: Path | None = None,
    stop: StopOnSignal | None = None,
) -> dict[str, float]:
    """Fit the SFT model and save it to ``out``; ``stop`` stops at a checkpoint on SLURM's signal
    (:func:`rredcot.infra.resume.stop_on_signal`), raising before ``out`` is written."""
    rows = read_jsonl(data)
    callback = MetricsCallback(run, hold=cfg["sft"]["save_every"] > 0)
    callbacks = [callback, *([stop] if stop is not None else [])]
    trainer = build_sft_trainer(cfg, rows, checkpoints, callbacks, resume_from)
    tok, model = trainer.processing_class, trainer.model
    t0 = time.time()
    result = trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    if stop is not None:
        stop.check()  # stopped on a signal: the checkpoint is saved, no output is written
    save_model_whole(trainer, tok, out)  # the model appears whole or not at all
    resumed_step = checkpoint_step(resume_from) if resume_from else 0
    return {
        "sft_seconds": time.time() - t0,
        "resumed_from_step": resumed_step,
        "sft_final_loss": mean_loss(float(result.training_loss), trainer.state, resumed_step),
        "n_params": float(sum(p.numel() for p in model.parameters())),
        "n_examples": float(len(trainer.train_dataset)),
    }


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", nargs="+", required=True, help="config YAML file(s), later ones override")
    ap.add_argument("--data", required=True, help="SFT split (JSONL with problem and completion)")
    ap.add_argument("--out", required=True, help="output model directory")
    ap.add_argument(
        "--checkpoint-dir",
        help="checkpoints of this job, kept across crashes (<results_dir>/checkpoints/sft)",
    )
    args = ap.parse_args(argv)
    cfg = stage_config(args.config, "sft")
    set_threads(cfg["threads"]["sft"])
    state = process_state()
    checkpoints = Path(args.checkpoint_dir or Path(cfg["results_dir"]) / "checkpoints" / "sft")
    with resumable_job(
        cfg,
        state,
        checkpoints,
        job_settings(cfg),
        [args.data],
        rule="sft",
        name="sft",
        resume=cfg["sft"]["resume"],
        save_every=cfg["sft"]["save_every"],
        log=_log,
        params={"model": cfg["model"], "sft": cfg["sft"], "data": args.data},
    ) as job:
        summary = run_sft(cfg, args.data, Path(args.out), job.run, checkpoints, job.resume_from, job.stop)
        if state.is_main_process:
            job.run.log_metrics(summary)
            _log.info(f"{summary}")


if __name__ == "__main__":
    setup_logging()
    main()
