"""A tiny policy on the synthetic task for credit-arm tests: config, tokenizer, untrained model, splits,
and the check every redistributed advantage must pass."""

from __future__ import annotations

from typing import Any

import torch

from rredcot.data.synthetic import TaskConfig, generate_splits
from rredcot.lm.modeling import build_scratch_model, train_tokenizer
from rredcot.settings.config import load_config

SMALL = {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64}
RL = {"prompts_per_step": 2, "num_generations": 4, "max_completion_length": 40, "max_steps": 1}


def synthetic_setup(overrides: dict[str, Any] | None = None) -> tuple[dict, Any, torch.nn.Module, dict]:
    """(config, tokenizer, model, splits): one group step of 2 prompts x 4 completions of 40 tokens."""
    cfg = load_config("config/config.yaml", {"rl": RL, **(overrides or {})})
    splits = generate_splits(TaskConfig(n_sft=300, n_rl=40, n_test=10, seed=3, teacher_error_rate=0.2))
    template = cfg["prompt"]["template"]
    tok = train_tokenizer(
        [template.replace("{problem}", r["problem"]) + r["completion"] for r in splits["sft"]], 300
    )
    tok.padding_side = "left"
    model = build_scratch_model(tok, {**cfg["model"], **SMALL}, seed=0)
    return cfg, tok, model, splits


def varied_reward(completions: list[str], **_: Any) -> list[float]:
    """A reward that differs within a group (by length), so that advantages are not all 0."""
    return [1.0 / (1 + len(c)) for c in completions]


def assert_redistributed(batch: dict[str, Any]) -> None:
    """Each completion's per-token advantages are its advantage times σ·|o|: same sign, mean kept."""
    adv, mask = batch["advantages"], batch["completion_mask"].bool()
    assert adv.dim() == 2
    for i in range(adv.shape[0]):
        row = adv[i][mask[i]]
        if row.numel() and row.mean().abs() > 1e-8:
            f = row / row.mean()
            assert (f >= -1e-6).all() and abs(float(f.sum()) - f.numel()) < 1e-3


def arm_trainer(setup: tuple, arm: str, **extra: Any) -> tuple[Any, Any]:
    """(RREDCoTTrainer of ``arm`` on a copy of the setup's model, its RL dataset); ``extra`` goes to the
    trainer (e.g. ``culprit=``, ``rollout_reward=``)."""
    import copy

    from datasets import Dataset

    from rredcot.adapter.experiment import grpo_args
    from rredcot.adapter.trainer import RREDCoTTrainer
    from rredcot.data.records import rl_records
    from rredcot.settings.config import credit_config

    cfg, tok, model, splits, out = setup
    dataset = Dataset.from_list(rl_records(splits["rl"], cfg["prompt"]["template"]))
    trainer = RREDCoTTrainer(
        model=copy.deepcopy(model),
        reward_funcs=[varied_reward],
        args=grpo_args(cfg, arm, 0, out / arm),
        train_dataset=dataset,
        processing_class=tok,
        credit=credit_config(cfg, arm),
        **extra,
    )
    return trainer, dataset


def one_credit_step(trainer: Any, dataset: Any) -> dict[str, Any]:
    """Generate, reward and assign credit for the first 8 rows (one step's batch) in training mode."""
    torch.manual_seed(0)
    trainer.model.train()
    return trainer._generate_and_score_completions([dataset[i] for i in range(8)])
