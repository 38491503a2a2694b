"""A few GRPO steps on a tiny model under ``accelerate launch``; each process writes what it saw.

Run by tests/test_distributed.py as ``accelerate launch [--config_file C] --num_processes 2
tests/multiprocess_job.py MODE BASE OUT``: MODE ``uniform`` trains stock ``GRPOTrainer`` and
``RREDCoTTrainer`` with uniform credit under the same launch; ``rredcot`` and ``reference`` train with
RREDCoT credit (group pairs on; ``reference`` scores with the frozen start model); ``prime`` trains
with PRIME's credit, each process keeping a whole implicit reward model. Every process
writes ``OUT.rank<i>.json``: losses, a hash of its parameters, and the credit metrics and local
trace counts.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import torch
from datasets import Dataset
from trl import GRPOTrainer

from rredcot.adapter.distributed import process_state
from rredcot.adapter.experiment import grpo_args
from rredcot.adapter.trainer import RREDCoTTrainer
from rredcot.data.records import rl_records
from rredcot.infra.io import read_jsonl
from rredcot.lm.modeling import load_tokenizer
from rredcot.settings.config import credit_config, load_config

ROOT = Path(__file__).resolve().parents[1]
OVERRIDES = {
    "rl": {
        "max_steps": 3,
        "prompts_per_step": 2,
        "num_generations": 4,
        "max_completion_length": 24,
        "save_every": 0,
        "eval_every": 0,
    },
    "credit": {"group_pairs": True, "view_every": 0},
}


def length_reward(completions, **_):
    """Dense, so that a random model gets advantages on every process."""
    return [1.0 / (1 + len(c)) for c in completions]


class Counting(RREDCoTTrainer):
    """Counts the traces this process assigns credit to (before gathering)."""

    local_traces: list[int] = []

    def _credit_multipliers(self, inputs, out):  # noqa: ANN001
        lengths = out["completion_mask"].sum(dim=1)
        self.local_traces.append(int(((out["advantages"] != 0) & (lengths > 0)).sum()))
        return super()._credit_multipliers(inputs, out)


def digest(state: dict) -> str:
    h = hashlib.sha256()
    for name, p in sorted(state.items()):
        h.update(name.encode())
        h.update(p.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()


def run(cls, cfg, arm, base: Path, out: Path, **extra) -> dict:
    torch.manual_seed(0)
    tok = load_tokenizer(base / "model")
    dataset = Dataset.from_list(rl_records(read_jsonl(base / "rl.jsonl"), cfg["prompt"], tok))
    args = grpo_args(cfg, arm, 0, out, process_state().num_processes)
    args.model_init_kwargs = {"dtype": torch.float32, "device_map": None}
    args.disable_tqdm = True
    trainer = cls(
        model=str(base / "model"),
        reward_funcs=[length_reward],
        args=args,
        train_dataset=dataset,
        processing_class=tok,
        **extra,
    )
    start = digest(trainer.model.state_dict()) if trainer.accelerator.state.deepspeed_plugin is None else None
    trainer.train()
    # Whole weights on every process (DDP, ZeRO-2); ZeRO-3 consolidates them on the main one only.
    full = trainer.accelerator.get_state_dict(trainer.model_wrapped)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    metrics: dict[str, list[float]] = {}
    for row in trainer.state.log_history:
        for k, v in row.items():
            if k.startswith("credit/"):
                metrics.setdefault(k, []).append(v)
    return {
        "losses": losses,
        "params": digest(full) if full else None,
        "start": start,
        "credit": {k: list(map(float, v)) for k, v in metrics.items()},
        "local_traces": list(getattr(trainer, "local_traces", [])),
        "prm": digest(trainer._prime.model.state_dict()) if getattr(trainer, "_prime", None) else None,
        "prime_loss": [float(h["prime/loss"]) for h in trainer.state.log_history if "prime/loss" in h],
        "backend": str(trainer.accelerator.distributed_type),
        "processes": trainer.accelerator.num_processes,
    }


def main() -> None:
    mode, base, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    cfg = load_config([ROOT / "config" / "config.yaml", ROOT / "config" / "smoke.yaml"], OVERRIDES)
    state = process_state()
    result = {}
    if mode == "uniform":
        result["stock"] = run(GRPOTrainer, cfg, "grpo", base, out / "stock")
        result["ours"] = run(
            RREDCoTTrainer, cfg, "grpo", base, out / "ours", credit=credit_config(cfg, "grpo")
        )
    elif mode == "prime":
        result["ours"] = run(
            RREDCoTTrainer,
            cfg,
            "prime",
            base,
            out / mode,
            credit=credit_config(cfg, "prime"),
            rollout_reward=lambda row, text: 1.0 / (1 + len(text)),
        )
    else:
        credit = credit_config(cfg, "rredcot")
        credit.value_model = "reference" if mode == "reference" else "policy"
        Counting.local_traces = []
        result["ours"] = run(Counting, cfg, "rredcot", base, out / mode, credit=credit)
    path = out.with_name(f"{out.name}.rank{state.process_index}.json")
    path.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
