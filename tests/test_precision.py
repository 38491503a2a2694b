"""Mixed precision keeps float32 master weights: a learning rate of 1e-6 moves a bf16-run model.

In pure bf16 (weights and Adam states in bf16) a step of 1e-6 on a weight near 0.02 is far below half
bf16's spacing there (about 6e-5) and rounds to no change: the run would stay at its start with no
error. The control case shows exactly that, so the test can tell the two apart.
"""

from __future__ import annotations

import copy

import torch
from trl import GRPOConfig

from rredcot.adapter.experiment import build_trainer, grpo_args
from rredcot.adapter.trainer import CreditConfig, RREDCoTTrainer
from rredcot.data.synthetic import TaskConfig, generate_splits
from rredcot.lm.modeling import build_scratch_model, train_tokenizer
from rredcot.settings.config import load_config

OVERRIDES = {
    "model": {"dtype": "bfloat16"},
    "rl": {
        "learning_rate": 1e-6,
        "max_steps": 1,
        "prompts_per_step": 2,
        "num_generations": 4,
        "max_completion_length": 24,
        "eval_every": 0,
        "save_every": 0,
    },
}
TINY = {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64}


def length_reward(completions, **_):
    return [1.0 / (1 + len(c)) for c in completions]


def _changed(before: dict, trainer) -> dict[str, float]:
    """Share of elements that moved, per decoder weight matrix."""
    out = {}
    for name, p in trainer.accelerator.unwrap_model(trainer.model).named_parameters():
        if ".layers." in name and name.endswith("proj.weight"):
            out[name] = float((p.detach().float() != before[name].float()).float().mean())
    return out


def test_a_small_learning_rate_moves_a_bf16_run(tmp_path):
    cfg = load_config("config/config.yaml", OVERRIDES)
    splits = generate_splits(TaskConfig(n_sft=200, n_rl=16, n_test=4, seed=1))
    corpus = [
        cfg["prompt"]["template"].replace("{problem}", r["problem"]) + r["completion"] for r in splits["sft"]
    ]
    tok = train_tokenizer(corpus, 300)
    model = build_scratch_model(tok, {**cfg["model"], **TINY}, seed=0)
    start = tmp_path / "start"
    model.save_pretrained(start)
    tok.save_pretrained(start)

    trainer = build_trainer(
        cfg, "grpo", 0, str(start), splits["rl"], tmp_path / "out", reward_funcs=[length_reward]
    )
    assert trainer.args.bf16 and trainer.args.cast_lm_head_to_fp32
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    assert all(p.dtype == torch.float32 for p in before.values())  # master weights
    trainer.train()
    moved = _changed(before, trainer)
    assert moved and min(moved.values()) > 0.9, moved

    # Control: the same step in pure bf16 (a bf16 model handed to TRL) leaves almost every weight.
    pure = copy.deepcopy(model).to(torch.bfloat16)
    args: GRPOConfig = grpo_args(cfg, "grpo", 0, tmp_path / "pure")
    control = RREDCoTTrainer(
        model=pure,
        reward_funcs=[length_reward],
        args=args,
        train_dataset=trainer.train_dataset,
        processing_class=trainer.processing_class,
        credit=CreditConfig(method="uniform"),
    )
    before = {n: p.detach().clone() for n, p in control.model.named_parameters()}
    control.train()
    stuck = _changed(before, control)
    assert max(stuck.values()) < 0.1, stuck
