"""The oracle credit arm: the synthetic task says where a wrong trace first goes wrong, and σ puts the
blame there on RREDCoT's own segments (the ceiling of segment-level credit)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from synthetic_setup import arm_trainer, assert_redistributed, one_credit_step, synthetic_setup

from rredcot.adapter.experiment import grpo_args
from rredcot.data.synthetic import culprit, culprit_offset
from rredcot.method import credit as C
from rredcot.method import segmentation as S
from rredcot.method.assign import CreditAssigner
from rredcot.method.registry import TraceInput, credit_method
from rredcot.settings.config import credit_config

PROBLEM = "Start at 9, times 2, add 6. Work mod 10."  # 9 * 2 = 8, 8 + 6 = 4
COPIED = "First, 9 * 2 = 8.\nFinally, 8 + 6 = 5.\n</think>\n9 * 2 = 8, 8 + 6 = 5. \\boxed{5}"
SLIP = "First, 9 * 2 = 8.\nFinally, 8 + 6 = 4.\n</think>\n9 * 2 = 8, 8 + 6 = 5. \\boxed{5}"
RIGHT = "First, 9 * 2 = 8.\nFinally, 8 + 6 = 4.\n</think>\n9 * 2 = 8, 8 + 6 = 4. \\boxed{4}"


# -- the task's knowledge -----------------------------------------------------------------------------
def test_culprit_is_the_wrong_value_the_solution_copied():
    kind, at = culprit(PROBLEM, COPIED)
    assert kind == "thinking" and COPIED[at:].startswith("5.\n</think>")


def test_a_slip_in_the_solution_blames_the_answer_and_a_right_trace_nothing():
    assert culprit(PROBLEM, SLIP) == ("answer", SLIP.index("</think>"))
    assert culprit(PROBLEM, RIGHT) is None
    # A corrected slip is not a culprit: the "Wait," line set the value the solution copied.
    fixed = (
        "First, 9 * 2 = 7.\nWait, 9 * 2 = 8.\nFinally, 8 + 6 = 4.\n</think>\n9 * 2 = 8, 8 + 6 = 4. \\boxed{4}"
    )
    assert culprit(PROBLEM, fixed) is None


def test_culprit_offset_refuses_a_problem_it_cannot_check():
    assert culprit_offset({"problem": PROBLEM}, RIGHT) is None
    assert culprit_offset({"problem": PROBLEM}, COPIED) == COPIED.index("5.\n</think>")
    with pytest.raises(ValueError, match="synthetic task"):
        culprit_offset({"id": "x", "problem": "What is 1 + 1?"}, "2")


# -- σ of perfect blame ---------------------------------------------------------------------------------
def test_oracle_segment_rewards():
    assert C.oracle_segment_rewards(3, 1).tolist() == [0.0, -1.0, 0.0]
    assert C.oracle_segment_rewards(2, None).tolist() == [0.0, 0.0]
    with pytest.raises(ValueError):
        C.oracle_segment_rewards(2, 2)
    with pytest.raises(ValueError):
        C.oracle_segment_rewards(0, None)


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 6), min_size=1, max_size=8),
    data=st.data(),
    mix=st.floats(0.0, 1.0),
    advantage=st.sampled_from([-1.5, -0.1, 0.3, 2.0]),
)
def test_oracle_sigma_puts_the_blame_on_the_culprit(lengths, data, mix, advantage):
    k = data.draw(st.integers(0, len(lengths) - 1))
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    n = sum(lengths)
    ids = S.segment_ids_from_starts(starts, n)
    multiplier = credit_method("oracle").multiplier(
        n, advantage, mix, ids, C.oracle_segment_rewards(len(starts), k)
    )
    sigma = multiplier / n
    assert (sigma >= 0).all() and abs(float(sigma.sum()) - 1.0) < 1e-5
    share = float(sigma[ids == k].sum())
    if advantage < 0:  # the culprit segment takes the whole redistributed share, the rest is uniform
        assert share == pytest.approx((1 - mix) * lengths[k] / n + mix, abs=1e-5)
    else:  # nothing gained value: uniform credit, exactly GRPO
        assert torch.equal(multiplier, torch.ones(n))  # σ·|o| exactly 1 (σ·n may round in float32)


# -- in the assigner and the trainer ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return (*synthetic_setup(), tmp_path_factory.mktemp("oracle"))


def _oracle_credit(setup, completion: str, culprit_char: int | None, advantage: float = -1.0):
    cfg, tok, model, _, _ = setup
    assigner = CreditAssigner(tok, credit_config(cfg, "oracle"))
    prompt = assigner.encode(f"Problem: {PROBLEM}\n<think>\n")
    ids = assigner.encode(completion) + [tok.eos_token_id]
    texts = assigner.token_texts(ids)
    token = None
    if culprit_char is not None:
        ends = torch.tensor([len(t) for t in texts]).cumsum(0)
        token = int((ends > culprit_char).nonzero()[0])
    model.eval()
    (out,) = assigner.assign(model, [TraceInput(prompt, ids, advantage, [], culprit=culprit_char)])
    return texts, token, out


def test_oracle_blames_the_culprit_segment_on_rredcots_segments(setup):
    texts, token, out = _oracle_credit(setup, COPIED, COPIED.index("5.\n</think>"))
    n = len(texts)
    ids = S.segment_ids_from_starts(out.segment_starts, n)
    k = int(ids[token])
    sigma = out.multiplier / n
    # The answer segment starts at the model's own exit, as in RREDCoT.
    assert out.segment_starts[-1] == S.thinking_end(texts, "</think>\n") and len(out.segment_starts) >= 2
    assert k < len(out.segment_starts) - 1  # the culprit is a thinking segment
    assert abs(float(sigma.sum()) - 1.0) < 1e-5
    inside, outside = sigma[ids == k], sigma[ids != k]
    assert float(inside.min()) > float(outside.max())
    assert torch.allclose(outside, outside[0].expand_as(outside))  # the rest stays uniform


def test_oracle_blames_the_answer_segment_for_a_slip_and_leaves_right_traces_uniform(setup):
    texts, token, out = _oracle_credit(setup, SLIP, SLIP.index("</think>"))
    ids = S.segment_ids_from_starts(out.segment_starts, len(texts))
    assert int(ids[token]) == len(out.segment_starts) - 1 and out.answer_reward == -1.0
    _, _, right = _oracle_credit(setup, RIGHT, None, advantage=1.0)
    assert torch.equal(right.multiplier, torch.ones_like(right.multiplier))


def test_trainer_needs_the_tasks_culprits_and_uses_them(setup):
    with pytest.raises(ValueError, match="needs culprit="):
        arm_trainer(setup, "oracle")
    seen = []

    def culprit_of(row, text):
        seen.append((row["problem"], text))
        return culprit_offset(row, text)

    trainer, dataset = arm_trainer(setup, "oracle", culprit=culprit_of)
    batch = one_credit_step(trainer, dataset)
    splits = setup[3]
    assert seen and all(problem in PROBLEMS(splits) for problem, _ in seen)
    assert_redistributed(batch)


def PROBLEMS(splits) -> set[str]:
    return {r["problem"] for r in splits["rl"]}


def test_the_entropy_mask_arm_is_trls_top_entropy_quantile(setup):
    cfg, *_, out = setup
    assert grpo_args(cfg, "entropy_mask", 0, out / "m").top_entropy_quantile == 0.2
    assert grpo_args(cfg, "grpo", 0, out / "g").top_entropy_quantile == 1.0
