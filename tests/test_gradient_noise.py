"""scripts/gradient-noise.py: the policy gradient of one GRPO batch under each arm's credit, computed
with the trainer's credit code."""

from __future__ import annotations

import copy
import importlib.util
import random
from pathlib import Path

import pytest
import torch
from synthetic_setup import synthetic_setup

from rredcot.data import synthetic as syn
from rredcot.lm.generation import Completion
from rredcot.method.assign import CreditAssigner
from rredcot.settings.config import credit_config

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gradient_noise", ROOT / "scripts" / "gradient-noise.py")
gradient_noise = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gradient_noise)


class TeacherTraces:
    """A generator whose samples are the task's teacher traces (``error_rate`` wrong steps, never
    corrected): batches with known right and wrong completions for a model too small to solve any."""

    def __init__(self, tok, rows, template: str, error_rate: float) -> None:
        self.tok, self.task = tok, syn.TaskConfig(teacher_error_rate=error_rate, teacher_early_exit_rate=0.0)
        self.rows = {template.format(problem=r["problem"]): r for r in rows}

    def generate(self, prompts, *, n, temperature, max_new_tokens, seed, top_p=1.0):
        rng = random.Random(seed)
        out = []
        for prompt in prompts:
            row = self.rows[prompt]
            group = []
            for _ in range(n):
                text, _ = syn.teacher_trace(row["start"], [tuple(s) for s in row["steps"]], self.task, rng)
                ids = self.tok(text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
                group.append(Completion(ids, self.tok.decode(ids, skip_special_tokens=True), False))
            out.append(group)
        return out


@pytest.fixture(scope="module")
def setup():
    cfg, tok, model, splits = synthetic_setup()
    cfg = copy.deepcopy(cfg)
    # The oracle with no blame moved (mix 0): uniform σ through the oracle's code path.
    cfg["arms"]["flat"] = {**cfg["arms"]["oracle"], "credit_options": {"mix": 0.0}}
    rows = [r for r in splits["rl"] if r["noise"] is None][:2]
    return cfg, tok, model, rows


def _gradients(setup, error_rate: float, seed: int = 0):
    cfg, tok, model, rows = setup
    arms = ["grpo", "oracle", "flat"]
    assigners = {arm: CreditAssigner(tok, credit_config(cfg, arm)) for arm in arms}
    gen = TeacherTraces(tok, rows, cfg["prompt"]["template"], error_rate)
    return gradient_noise.batch_gradients(model, tok, gen, rows, cfg, arms, assigners, seed)


@pytest.mark.numerics
def test_credit_turns_the_batch_gradient_and_uniform_credit_is_grpos(setup) -> None:
    grads = _gradients(setup, error_rate=0.3)
    assert grads is not None and grads["grpo"].norm() > 0
    assert torch.allclose(grads["flat"], grads["grpo"], rtol=1e-4, atol=1e-7)
    cos = torch.nn.functional.cosine_similarity(grads["oracle"], grads["grpo"], dim=0)
    assert float(cos) < 0.999  # the blame moved to the culprits


def test_a_batch_without_advantages_has_no_gradient(setup) -> None:
    assert _gradients(setup, error_rate=0.0) is None  # every completion right: nothing to learn
