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


def arm_trainer(
    setup: tuple,
    arm: str,
    *,
    settings: dict | None = None,
    folder: str | None = None,
    callbacks: tuple = (),
    **extra: Any,
) -> tuple[Any, Any]:
    """(RREDCoTTrainer of ``arm`` on a copy of the setup's model, its RL dataset); ``settings``: the
    config (default: the setup's), ``folder``: its output folder under the setup's (default: the arm);
    ``extra`` goes to the trainer (e.g. ``culprit=``, ``rollout_reward=``)."""
    import copy

    from datasets import Dataset

    from rredcot.adapter.experiment import grpo_args
    from rredcot.adapter.trainer import RREDCoTTrainer
    from rredcot.data.records import rl_records
    from rredcot.settings.config import credit_config

    cfg, tok, model, splits, out = setup
    cfg = settings or cfg
    dataset = Dataset.from_list(rl_records(splits["rl"], cfg["prompt"]["template"]))
    trainer = RREDCoTTrainer(
        model=copy.deepcopy(model),
        reward_funcs=[varied_reward],
        args=grpo_args(cfg, arm, 0, out / (folder or arm)),
        train_dataset=dataset,
        processing_class=tok,
        callbacks=list(callbacks),
        credit=credit_config(cfg, arm),
        **extra,
    )
    return trainer, dataset


def one_credit_step(trainer: Any, dataset: Any) -> dict[str, Any]:
    """Generate, reward and assign credit for the first 8 rows (one step's batch) in training mode."""
    torch.manual_seed(0)
    trainer.model.train()
    return trainer._generate_and_score_completions([dataset[i] for i in range(8)])


def crash_and_resume(setup: tuple, arm: str, **extra: Any) -> tuple[Any, Any]:
    """(trainer run straight, trainer resumed): ``arm`` trained two steps straight, and two steps cut
    short in the save of step 2 (its checkpoint written, never sealed) then resumed from step 1's;
    each from a copy of the setup's model, on one thread. ``extra`` goes to the trainer."""
    import pytest
    from transformers import TrainerCallback

    from rredcot.infra.resume import RunLogger, latest_checkpoint

    class Crash(TrainerCallback):
        def on_save(self, args, state, control, **kw):  # noqa: ANN001
            if state.global_step == 2:
                raise RuntimeError("crash")

    cfg, out = setup[0], setup[4]
    settings = {**cfg, "rl": {**cfg["rl"], **RL, "max_steps": 2, "save_every": 1}}

    def run(folder: str, *callbacks: Any, resume: bool = False) -> Any:
        torch.manual_seed(0)
        logger = RunLogger(None, hold=False)
        trainer, _ = arm_trainer(
            setup, arm, settings=settings, folder=folder, callbacks=(*callbacks, logger), **extra
        )
        checkpoint = latest_checkpoint(out / folder) if resume else None
        trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
        return trainer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        straight = run(f"{arm}-straight")
        with pytest.raises(RuntimeError, match="crash"):
            run(f"{arm}-cut", Crash())
        assert latest_checkpoint(out / f"{arm}-cut").name == "checkpoint-1"  # step 2's was never sealed
        resumed = run(f"{arm}-cut", resume=True)
    finally:
        torch.set_num_threads(threads)
    assert resumed.state.global_step == 2
    return straight, resumed


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module, start: torch.nn.Module) -> None:
    """``a`` and ``b`` hold the same weights, and they are not ``start``'s (training moved them)."""
    moved = False
    for (name, x), y, s in zip(a.named_parameters(), b.parameters(), start.parameters(), strict=True):
        assert torch.equal(x, y), name
        moved |= not torch.equal(x, s)
    assert moved  # the comparison is not vacuous
