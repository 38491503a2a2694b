"""The attention kernel SFT trains in (``sft.attn_implementation``), and that it stays SFT's own."""

from __future__ import annotations

from pathlib import Path

import pytest

from rredcot.data.synthetic import TaskConfig, generate_splits
from rredcot.lm.modeling import load_model, sft_attention
from rredcot.settings.reads import stage_config
from rredcot.stages.sft import build_sft_trainer

SMALL = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 32}


def test_null_chooses_eager_for_a_scratch_model_and_leaves_a_pretrained_one_to_transformers() -> None:
    assert sft_attention({"kind": "scratch"}, None) == "eager"
    assert sft_attention({"kind": "pretrained"}, None) is None
    assert sft_attention({"kind": "scratch"}, "sdpa") == "sdpa"
    assert sft_attention({"kind": "pretrained"}, "eager") == "eager"


@pytest.mark.parametrize(("chosen", "expected"), [(None, "eager"), ("sdpa", "sdpa")])
def test_sft_trains_in_the_chosen_kernel_and_later_stages_load_transformers_choice(
    chosen: str | None, expected: str, tmp_path: Path
) -> None:
    rows = generate_splits(TaskConfig(n_sft=40, n_rl=4, n_test=4, seed=1))["sft"]
    overrides = {"model": SMALL, "sft": {"attn_implementation": chosen, "save_every": 0}}
    cfg = stage_config(["config/config.yaml"], "sft", overrides=overrides)
    trainer = build_sft_trainer(cfg, rows, tmp_path / "checkpoints", max_steps=2)
    assert trainer.model.config._attn_implementation == expected
    trainer.train()
    # The kernel is not saved with the model: RL, evaluation and the studies load transformers' choice.
    trainer.model.save_pretrained(tmp_path / "model")
    assert load_model(tmp_path / "model", "float32").config._attn_implementation == "sdpa"


def test_the_powered_recipe_keeps_the_kernel_its_runs_were_made_in() -> None:
    cfg = stage_config(["config/config.yaml", "config/testbed.yaml"], "sft")
    assert cfg["sft"]["attn_implementation"] == "sdpa"
