"""Each credit method reads only the settings it declares (``CreditSettings.read_by``): a train job's
params hold those alone, so the claim must hold in the code. Changing every other setting leaves the
method's σ exactly as it was; changing one it reads (``mix``) moves it."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from synthetic_setup import synthetic_setup

from rredcot.method.assign import CreditAssigner, paid_credit
from rredcot.method.registry import CREDIT_METHODS, TraceInput, credit_method
from rredcot.method.scoring.types import ScoringBudget
from rredcot.method.segmentation import SegmentationConfig
from rredcot.method.settings import CreditSettings, MonteCarloSettings, PrimeSettings, SpoSettings
from rredcot.settings.config import credit_config

PROBLEM = "Start at 9, times 2, add 6. Work mod 10."
WRONG = (
    "First, 9 * 2 = 8.\nNext, 8 + 6 = 5.\nCheck, 5 is the value.\nFinally, 5 it is.\n"
    "</think>\n9 * 2 = 8, 8 + 6 = 5. \\boxed{5}"
)

# A valid value for every setting, other than the default where the others allow it; a method must
# not depend on those it does not declare.
OTHER = {
    "mix": 0.9,
    "segmentation": SegmentationConfig(n_segments=3, min_segment_tokens=2),
    "group_pairs": True,
    "proposal": "uniform",  # "given" needs per-pair log q, and excludes group_pairs
    "value_model": "reference",
    "scorer": "naive",
    "answer_baseline": "reference",
    "value_space": "log",
    "precision": "float32",
    "budget": ScoringBudget(max_batch_tokens=512),
    "mc": MonteCarloSettings(samples=7, max_new_tokens=5, batch_size=3),
    "spo": SpoSettings(samples=5, max_new_tokens=6, batch_size=3, threshold=0.5, interval=2, whiten=False),
    "prime": PrimeSettings(
        beta=0.5,
        granularity="whole",
        normalise=False,
        process_coef=2.0,
        outcome_coef=0.5,
        process_gamma=0.9,
        outcome_gamma=0.8,
        whiten=False,
        lr=1e-3,
        weight_decay=0.1,
        grad_clip=1.0,
    ),
    "view_every": 3,
    "view_samples": 5,
}


@pytest.fixture(scope="module")
def setup():
    cfg, tok, model, _ = synthetic_setup()
    model.eval()
    return cfg, tok, model


def _sigma(setup, method: str, changes: dict) -> torch.Tensor:
    cfg, tok, model = setup
    base = dataclasses.replace(credit_config(cfg, "rredcot"), method=method)
    credit = dataclasses.replace(base, **changes)
    assigner = CreditAssigner(tok, credit)
    prompt = assigner.encode(f"Problem: {PROBLEM}\n<think>\n")
    ids = assigner.encode(WRONG) + [tok.eos_token_id]
    culprit = WRONG.index("5.\nCheck")  # the character where the trace first goes wrong

    def rollouts(policy, items, cuts):
        # Deterministic outcome sums that fall by one success per cut: the values depend on M.
        m = credit.rollout_settings.samples
        return [[float(max(m - i, 0)) for i in range(len(c))] for c in cuts]

    item = TraceInput(prompt, ids, -1.0, [("9 * 2 = 8, 8 + 6 = 4.", "4")], culprit=culprit, outcome=0.0)
    # Values that fall over several cuts (the task's own drop to 0 at one step would make the value
    # spaces agree).
    item.task_values = lambda offsets: [max(0.9 - 0.3 * i, 0.05) for i in range(len(offsets))]
    items = [item]
    if "process_log_probs" in credit.kind.needs:  # PRIME: a group of two, with PRM and reference log-probs
        steps = torch.arange(len(ids), dtype=torch.float64)
        item.prm_log_probs, item.ref_log_probs, item.group = -0.1 * steps.sin().abs(), -0.2 + 0 * steps, 0
        mate = dataclasses.replace(item, outcome=1.0, prm_log_probs=-0.3 * steps.cos().abs())
        items.append(mate)
    out = assigner.assign(model, items, value_model=model, rollouts=rollouts)[0]
    return paid_credit(out, item.advantage)  # the token advantages: A·σ·|o|, or the method's own


@pytest.mark.parametrize("method", sorted(CREDIT_METHODS))
def test_settings_a_method_does_not_read_leave_its_credit_alone(setup, method: str) -> None:
    read = CreditSettings.read_by(credit_method(method))
    assert set(OTHER) == {f.name for f in dataclasses.fields(CreditSettings)}
    before = _sigma(setup, method, {})
    unread = {name: value for name, value in OTHER.items() if name not in read}
    assert torch.equal(_sigma(setup, method, unread), before)
    if "mix" in read:
        assert not torch.allclose(_sigma(setup, method, {"mix": 1.0}), before)
    elif credit_method(method).form == "advantage":  # its own token advantages: no mix to read
        assert before.abs().sum() > 0
    else:
        assert credit_method(method).uniform and torch.equal(before, -torch.ones_like(before))
    if "value_space" in read:  # the wrong trace loses value in more than one segment
        assert not torch.allclose(_sigma(setup, method, {"value_space": "log"}), before)
