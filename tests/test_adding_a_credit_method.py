"""A new credit method is one registered function in one module (tests/answer_blame.py, the example
of docs/library.md, "Adding a credit method"): it reads the settings its source declares, runs
through CreditAssigner and through RREDCoTTrainer like the built-in methods."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from synthetic_setup import assert_redistributed, one_credit_step, synthetic_setup, varied_reward

from rredcot.method import segmentation as S
from rredcot.method.assign import CreditAssigner
from rredcot.method.registry import CREDIT_METHODS, REWARD_SOURCES, TraceInput, credit_method
from rredcot.method.settings import CreditSettings
from rredcot.settings.config import credit_config

WRONG = "First, 9 * 2 = 8.\nFinally, 8 + 6 = 4.\n</think>\n9 * 2 = 8, 8 + 6 = 5. \\boxed{5}"


@pytest.fixture(scope="module")
def registered():
    """Import the example module (it registers itself), and take it out again afterwards so that the
    other tests see the built-in registry."""
    import answer_blame  # noqa: F401

    yield credit_method("answer_blame")
    del CREDIT_METHODS["answer_blame"], REWARD_SOURCES["answer_blame"]


@pytest.fixture(scope="module")
def setup():
    cfg, tok, model, _ = synthetic_setup()
    return cfg, tok, model.eval()


def test_the_new_method_declares_what_it_reads(registered):
    assert not registered.uniform and registered.needs == ()
    read = ("mix", "budget", "precision", "view_every", "view_samples", "segmentation")
    assert CreditSettings.read_by(registered) == read


@pytest.mark.parametrize("advantage", [-1.0, 1.0])
def test_the_answer_segment_takes_the_redistributed_share(registered, setup, advantage):
    cfg, tok, model = setup
    credit = dataclasses.replace(credit_config(cfg, "rredcot"), method="answer_blame", mix=1.0)
    assigner = CreditAssigner(tok, credit)
    ids = assigner.encode(WRONG) + [tok.eos_token_id]
    prompt = assigner.encode("Problem: Start at 9, times 2, add 6. Work mod 10.\n<think>\n")
    item = TraceInput(prompt, ids, advantage, [])
    with torch.inference_mode():
        (out,) = assigner.assign(model, [item])
    answer_at = S.thinking_end(assigner.token_texts(ids), credit.exit_string)
    assert out.segment_starts[-1] == answer_at
    sigma = out.multiplier / len(ids)
    assert float(sigma.sum()) == pytest.approx(1.0, abs=1e-5)
    # mix 1: every token of the answer segment shares all the credit, the thinking gets none.
    assert float(sigma[answer_at:].sum()) == pytest.approx(1.0, abs=1e-5)
    assert torch.all(sigma[:answer_at] == 0)


def test_the_trainer_runs_the_new_method(registered, tmp_path):
    """RREDCoTTrainer with ``CreditConfig(method="answer_blame")``: each advantage is redistributed."""
    from datasets import Dataset

    from rredcot.adapter.experiment import grpo_args
    from rredcot.adapter.trainer import RREDCoTTrainer
    from rredcot.data.records import rl_records

    cfg, tok, model, splits = synthetic_setup()
    credit = dataclasses.replace(credit_config(cfg, "rredcot"), method="answer_blame")
    dataset = Dataset.from_list(rl_records(splits["rl"], cfg["prompt"]["template"]))
    trainer = RREDCoTTrainer(
        model=model,
        reward_funcs=[varied_reward],
        args=grpo_args(cfg, "rredcot", 0, tmp_path / "answer_blame"),
        train_dataset=dataset,
        processing_class=tok,
        credit=credit,
    )
    batch = one_credit_step(trainer, dataset)
    assert_redistributed(batch)
    assert trainer._metrics["train"]["credit/traces"][-1] > 0
