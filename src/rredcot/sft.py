"""SFT warm-up: the starting policy for every RL arm.

For ``model.kind: scratch`` a byte-level BPE tokenizer is trained on the SFT split and a small Qwen2
model is initialised; for ``pretrained`` the checkpoint named in the config is loaded. Either way
TRL's SFTTrainer fits the teacher completions (loss on completion tokens only) and the result is
saved with ``save_pretrained``.

CLI: ``python -m rredcot.sft --config C --data sft.jsonl --out results/models/sft``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from transformers import TrainerCallback
from trl import SFTConfig, SFTTrainer

from rredcot.config import load_config
from rredcot.data import format_prompt, sft_records
from rredcot.jsonl import atomic_dir, read_jsonl
from rredcot.modeling import build_scratch_model, load_model, load_tokenizer, set_threads, train_tokenizer


class MetricsCallback(TrainerCallback):
    """Forwards the trainer's logged numbers to the job's MLflow run."""

    def __init__(self, run: Any) -> None:
        self.run = run

    def on_log(self, args, state, control, logs=None, **kw):  # noqa: ANN001
        if logs:
            self.run.log_metrics(
                {k: float(v) for k, v in logs.items() if isinstance(v, int | float)}, step=state.global_step
            )


def build_start(cfg: Mapping[str, Any], rows: list[dict]) -> tuple[Any, Any]:
    """Tokenizer and untrained (or pretrained) model for SFT."""
    spec = cfg["model"]
    if spec["kind"] == "pretrained":
        return load_tokenizer(spec["name_or_path"]), load_model(spec["name_or_path"])
    template = cfg["prompt"]["template"]
    corpus = [format_prompt(template, r["problem"]) + r["completion"] for r in rows]
    tok = train_tokenizer(corpus, spec["vocab_size"])
    return tok, build_scratch_model(tok, spec, cfg["sft"]["seed"])


def run_sft(cfg: Mapping[str, Any], data: str, out: Path, run: Any) -> dict[str, float]:
    rows = read_jsonl(data)
    tok, model = build_start(cfg, rows)
    tok.padding_side = "right"  # training pads on the right; generation switches to left
    records = sft_records(rows, cfg["prompt"]["template"], tok.eos_token)
    s = cfg["sft"]
    args = SFTConfig(
        output_dir=str(out.parent / f".{out.name}.trainer"),
        per_device_train_batch_size=s["batch_size"],
        num_train_epochs=s["epochs"],
        learning_rate=s["learning_rate"],
        lr_scheduler_type="cosine",
        warmup_steps=s["warmup_steps"],
        weight_decay=s["weight_decay"],
        max_length=s["max_length"],
        logging_steps=25,
        save_strategy="no",
        report_to="none",
        bf16=False,
        use_cpu=not torch.cuda.is_available(),
        seed=s["seed"],
        dataloader_num_workers=0,
    )
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(records),
        processing_class=tok,
        callbacks=[MetricsCallback(run)],
    )
    t0 = time.time()
    result = trainer.train()
    with atomic_dir(out) as tmp:
        trainer.model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
    return {
        "sft_seconds": time.time() - t0,
        "sft_final_loss": float(result.training_loss),
        "n_params": float(sum(p.numel() for p in model.parameters())),
        "n_examples": float(len(records)),
    }


def main(argv: Sequence[str] | None = None) -> None:
    from rredcot.tracking import stage_run

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", nargs="+", required=True, help="config YAML file(s), later ones override")
    ap.add_argument("--data", required=True, help="SFT split (JSONL with problem and completion)")
    ap.add_argument("--out", required=True, help="output model directory")
    args = ap.parse_args(argv)
    cfg = load_config(args.config)
    set_threads(cfg["threads"]["sft"])
    with stage_run(
        cfg,
        "sft",
        rule="sft",
        params={"model": cfg["model"], "sft": cfg["sft"], "data": args.data},
    ) as run:
        summary = run_sft(cfg, args.data, Path(args.out), run)
        run.log_metrics(summary)
        print(f"[sft] {summary}")


if __name__ == "__main__":
    main()
