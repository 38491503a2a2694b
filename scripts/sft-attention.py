"""What an SFT step costs under each attention kernel (``sft.attn_implementation``).

Builds the SFT stage's own trainer (``rredcot.stages.sft.build_sft_trainer``) once per kernel and
times the same optimizer steps of each (same seed, same batches, no checkpoints), the kernels taking
turns ``--repeats`` times so that a machine's drift does not favour one. From a fresh model by
default; ``--model`` starts every run from a trained one instead (the SFT stage's output). Prints
seconds per step (mean and median) and the ratio to the first kernel; ``--profile`` adds
torch.profiler's top operators of each run. What the default's SFT costs in each kernel:
docs/results.md#the-default-run.

    python scripts/sft-attention.py --data results/data/sft.jsonl
    python scripts/sft-attention.py --data results/data/sft.jsonl --model results/models/sft --steps 150

A few hundred steps of the default model take well under a minute per run on two threads.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from pathlib import Path

from transformers import TrainerCallback

from rredcot.infra.io import read_jsonl
from rredcot.lm.modeling import load_model, load_tokenizer, set_threads
from rredcot.settings.reads import StageView, stage_config
from rredcot.stages.sft import build_sft_trainer


class StepClock(TrainerCallback):
    """Wall time of every optimizer step."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._t = 0.0

    def on_step_begin(self, args, state, control, **kw):  # noqa: ANN001
        self._t = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):  # noqa: ANN001
        self.seconds.append(time.perf_counter() - self._t)


def time_kernel(
    cfg: StageView, rows: list[dict], kernel: str, steps: int, model: str | None, profile: bool
) -> list[float]:
    cfg = copy.deepcopy(cfg)
    cfg["sft"]["attn_implementation"] = kernel
    cfg["sft"]["save_every"] = 0
    start = (load_tokenizer(model), load_model(model, "float32", kernel)) if model else None
    clock = StepClock()
    with tempfile.TemporaryDirectory() as tmp:
        trainer = build_sft_trainer(cfg, rows, Path(tmp), [clock], max_steps=steps, start=start)
        if not profile:
            trainer.train()
            return clock.seconds
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            trainer.train()
    print(f"\n{kernel}: torch.profiler, self CPU time")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
    return clock.seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", nargs="+", default=["config/config.yaml"], help="config YAML file(s)")
    ap.add_argument("--data", required=True, help="SFT split (the data rule's sft.jsonl)")
    ap.add_argument("--model", help="start every run from this trained model (default: a fresh one)")
    ap.add_argument("--kernels", nargs="+", default=["sdpa", "eager"], help="attention kernels to time")
    ap.add_argument("--steps", type=int, default=200, help="optimizer steps per run")
    ap.add_argument("--repeats", type=int, default=2, help="runs per kernel, taking turns")
    ap.add_argument("--threads", type=int, help="torch threads (default: the config's threads.sft)")
    ap.add_argument("--profile", action="store_true", help="also print torch.profiler's top operators")
    args = ap.parse_args()
    cfg = stage_config(args.config, "sft")
    set_threads(args.threads or cfg["threads"]["sft"])
    rows = read_jsonl(args.data)
    seconds: dict[str, list[float]] = {k: [] for k in args.kernels}
    for repeat in range(args.repeats):
        for kernel in args.kernels:
            run = time_kernel(cfg, rows, kernel, args.steps, args.model, args.profile)
            seconds[kernel] += run
            mean = statistics.fmean(run)
            print(f"run {repeat + 1}, {kernel}: {len(run)} steps, {mean:.3f} s a step", flush=True)
    first = statistics.fmean(seconds[args.kernels[0]])
    print(f"\n| kernel | s a step (mean) | median | ratio to {args.kernels[0]} |\n|---|---|---|---|")
    for kernel, values in seconds.items():
        mean = statistics.fmean(values)
        print(f"| {kernel} | {mean:.3f} | {statistics.median(values):.3f} | {mean / first:.2f} |")


if __name__ == "__main__":
    main()
