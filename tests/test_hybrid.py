"""Hybrid models (linear-attention or state-space layers beside attention) get credit that works.

Their cache holds a recurrent state that cannot be cut at an exit point, so the single-pass scorer
does not apply: ``CreditAssigner`` says so once and scores naively, and the greedy answer baseline
decodes first and teacher-forces after. Checked on tiny Qwen3-Next and NemotronH models.
"""

from __future__ import annotations

import logging
import random

import pytest
import torch
from tiny_models import CharTokens, tiny_nemotron_h, tiny_qwen, tiny_qwen3_next

from rredcot.method.assign import CreditAssigner
from rredcot.method.registry import TraceInput
from rredcot.method.scoring.naive import score_traces_naive
from rredcot.method.scoring.single_pass import supports_single_pass
from rredcot.method.scoring.types import TraceExits
from rredcot.method.settings import CreditConfig

VOCAB = 40
HYBRIDS = {"qwen3-next": tiny_qwen3_next, "nemotron-h": tiny_nemotron_h}


def test_hybrid_caches_are_not_cut():
    assert supports_single_pass(tiny_qwen(VOCAB + 1, 0, "sdpa"))
    for build in HYBRIDS.values():
        assert not supports_single_pass(build(VOCAB + 1, 0))


@pytest.mark.numerics
@pytest.mark.parametrize("name", list(HYBRIDS))
def test_rredcot_credit_on_a_hybrid_model(name, caplog):
    model = HYBRIDS[name](CharTokens.eos_token_id + 1, 1)
    tok = CharTokens()
    cfg = CreditConfig(method="rredcot", exit_string="\nz\n", answer_prefix=" x{", answer_suffix="}")
    assigner = CreditAssigner(tok, cfg)
    rng = random.Random(0)
    items = []
    for n in (3, 5):
        thinking = "\n".join("".join(rng.choice("abcdef ") for _ in range(6)) for _ in range(n))
        completion = tok(f"{thinking}\nz\nabc x{{7}}")["input_ids"] + [tok.eos_token_id]
        items.append(TraceInput(tok("q 1 2")["input_ids"], completion, -1.0, [("ab cd", "8")]))
    with caplog.at_level(logging.WARNING, logger="rredcot.method.assign"):
        credits = assigner.assign(model, items)
    assert sum("scored naively" in r.getMessage() for r in caplog.records) == 1
    for item, tc in zip(items, credits, strict=True):
        n = len(item.completion_ids)
        assert torch.isfinite(tc.multiplier).all() and (tc.multiplier >= 0).all()
        assert float(tc.multiplier.sum()) == pytest.approx(n, rel=1e-5)
        assert tc.answer_reward is not None and tc.baseline_solution is not None
    # The exit values are the naive scorer's at the same cuts.
    strings = assigner.strings()
    specs = [
        TraceExits(
            it.prompt_ids, it.completion_ids, tc.cuts, [(assigner.encode("ab cd"), assigner.encode("8"))]
        )
        for it, tc in zip(items, credits, strict=True)
    ]
    for tc, sc in zip(credits, score_traces_naive(model, specs, strings), strict=True):
        torch.testing.assert_close(tc.log_p_solution, sc.log_p_solution)
        torch.testing.assert_close(tc.log_p_answer, sc.log_p_answer)
