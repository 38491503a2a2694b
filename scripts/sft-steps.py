"""How many SFT steps a model needs on the synthetic task: held-out greedy accuracy along the SFT stage's
own training run.

Builds the SFT stage's trainer (``rredcot.stages.sft.build_sft_trainer``, the config's model, prompt
and SFT settings) and probes held-out greedy accuracy every ``--every`` optimizer steps, with the
model in training (transformers generation, under the run's autocast). Prints one line per probe
(step, seconds, mean training loss since the last probe, greedy accuracy overall and by level) and
writes them as JSON with ``--out``. What it measured for SmolLM2-135M-Instruct:
docs/results.md#smollm2-135m-instruct-on-the-testbed.

    python scripts/sft-steps.py --config config/smollm2.yaml --data results/smollm2/data/sft.jsonl \\
        --eval-data results/smollm2/data/test.jsonl --steps 400 --every 50

The model must exist first (for ``model.gguf``: ``snakemake --cores 1 --configfile C -- <its folder>``).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import TrainerCallback

from rredcot.infra.io import read_jsonl
from rredcot.lm.evaluation import evaluate_rows
from rredcot.lm.modeling import set_threads
from rredcot.settings.reads import stage_config
from rredcot.stages.sft import build_sft_trainer


class Probe(TrainerCallback):
    """Greedy held-out accuracy every ``every`` steps (and at the last)."""

    def __init__(self, rows: list[dict], cfg, every: int, max_new_tokens: int) -> None:
        self.rows, self.cfg, self.every, self.max_new_tokens = rows, cfg, every, max_new_tokens
        self.trainer = None
        self.points: list[dict] = []
        self.losses: list[float] = []
        self.t0 = time.time()

    def on_log(self, args, state, control, logs=None, **kw):  # noqa: ANN001
        if logs and "loss" in logs:
            self.losses.append(float(logs["loss"]))

    def on_step_end(self, args, state, control, **kw):  # noqa: ANN001
        step = state.global_step
        if step % self.every and step != state.max_steps:
            return
        model, tok = self.trainer.model, self.trainer.processing_class
        tok.padding_side = "left"
        eval_cfg = {
            **self.cfg["eval"],
            "n_samples": 0,
            "max_new_tokens": self.max_new_tokens,
            "keep_completions": False,
        }
        dtype = self.cfg["model"]["dtype"]
        autocast = torch.autocast("cpu", dtype=getattr(torch, dtype), enabled=dtype != "float32")
        with autocast:
            records, summary = evaluate_rows(
                model, tok, self.rows, self.cfg["prompt"], eval_cfg, seed=0, progress=False, greedy=True
            )
        tok.padding_side = "right"
        model.train()
        point = {
            "step": step,
            "seconds": round(time.time() - self.t0, 1),
            "loss": round(statistics.fmean(self.losses), 4) if self.losses else None,
            "greedy": round(summary["all"]["greedy"], 4),
            "by_level": {k: round(v["greedy"], 3) for k, v in summary.items() if k != "all"},
            "example": records[-1]["greedy_completion"][:160],
        }
        self.losses = []
        self.points.append(point)
        print(json.dumps(point), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", nargs="+", required=True, help="config YAML file(s)")
    ap.add_argument("--data", required=True, help="SFT split (the data rule's sft.jsonl)")
    ap.add_argument("--eval-data", required=True, help="held-out problems (the data rule's test.jsonl)")
    ap.add_argument("--steps", type=int, default=400, help="optimizer steps")
    ap.add_argument("--every", type=int, default=50, help="probe every this many steps")
    ap.add_argument("--problems", type=int, default=100, help="held-out problems per probe")
    ap.add_argument("--max-new-tokens", type=int, default=160, help="generation budget of a probe")
    ap.add_argument("--threads", type=int, help="torch threads (default: the config's threads.sft)")
    ap.add_argument("--out", type=Path, help="write the probes here as JSON")
    args = ap.parse_args()
    cfg = stage_config(args.config, "sft")
    set_threads(args.threads or cfg["threads"]["sft"])
    probe_cfg = stage_config(args.config, "evaluate")
    rows = read_jsonl(args.data)
    test = read_jsonl(args.eval_data)
    # A fixed random sample: the split cycles through the levels, so a stride could pick some only.
    held_out = random.Random(0).sample(test, min(args.problems, len(test)))
    cfg["sft"]["save_every"] = 0
    probe = Probe(held_out, probe_cfg, args.every, args.max_new_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = build_sft_trainer(cfg, rows, Path(tmp), [probe], max_steps=args.steps)
        probe.trainer = trainer
        trainer.train()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(probe.points, indent=1) + "\n")


if __name__ == "__main__":
    main()
