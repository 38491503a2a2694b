"""The exact-values credit arm: the synthetic task computes each exit point's value for a policy that
slips at its measured rate, and σ credits right traces as well as it blames wrong ones (the testbed's
ceiling of credit)."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from synthetic_setup import arm_trainer, assert_redistributed, one_credit_step, synthetic_setup

from rredcot.data.synthetic import (
    apply_op,
    batch_slip_rate,
    chain_value,
    exact_value_functions,
    exact_values,
    step_errors,
)
from rredcot.method import segmentation as S
from rredcot.method.assign import CreditAssigner
from rredcot.method.registry import TraceInput, credit_method
from rredcot.settings.config import credit_config

PROBLEM = "Start at 9, times 2, add 6, times 3. Work mod 10."  # 8, 4, 2
THINKING = "First, * 2 = 8.\nNext, + 6 = {b}.\nFinally, * 3 = {c}.\n</think>\n"
RIGHT = THINKING.format(b=4, c=2) + "9 * 2 = 8, 8 + 6 = 4, 4 * 3 = 2. \\boxed{2}"
WRONG = THINKING.format(b=5, c=5) + "9 * 2 = 8, 8 + 6 = 5, 5 * 3 = 5. \\boxed{5}"


# -- the task's exact values ------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    modulus=st.integers(2, 5),
    value=st.integers(0, 4),
    steps=st.lists(st.tuples(st.sampled_from("+-*"), st.integers(0, 4)), max_size=3),
    answer=st.integers(0, 4),
    slip=st.floats(0.0, 1.0),
)
def test_chain_value_is_the_probability_over_every_slip_pattern(modulus, value, steps, answer, slip):
    """Enumerate every path of written values: each step right with 1 - slip, or any other residue."""
    total = 0.0
    for path in itertools.product(range(modulus), repeat=len(steps)):
        p, current = 1.0, value % modulus
        for written, (op, operand) in zip(path, steps, strict=True):
            right = apply_op(current, op, operand, modulus)
            p *= (1 - slip) if written == right else slip / (modulus - 1)
            current = written
        total += p * (current == answer % modulus)
    assert chain_value(value, steps, answer, modulus, slip) == pytest.approx(total, abs=1e-12)


def test_a_wrong_value_is_not_always_lost():
    # times 5 mod 10 sends every odd residue to 5: from a wrong 3 the answer 5 is still certain.
    assert chain_value(3, [("*", 5)], 5, 10, 0.0) == 1.0
    assert chain_value(4, [("+", 1)], 6, 10, 0.0) == 0.0
    with pytest.raises(ValueError, match="slip rate"):
        chain_value(0, [], 0, 10, 1.5)


def test_exact_values_rise_along_a_right_trace_and_fall_at_the_wrong_step():
    offsets = [0, RIGHT.index("Next"), RIGHT.index("Finally"), RIGHT.index("</think>")]
    right = exact_values(PROBLEM, RIGHT, offsets, 0.2)
    assert right[0] < right[1] < right[2] < right[3] == 1.0
    assert right[2] == pytest.approx(0.8)  # one step left, computed right with 1 - slip
    wrong = exact_values(PROBLEM, WRONG, offsets, 0.2)
    assert wrong[:2] == right[:2]  # the same state before the slip
    assert wrong[2] < 0.05 and wrong[3] == 0.0  # 5 * 3 = 5: only another slip could land on 2
    with pytest.raises(ValueError, match="synthetic task"):
        exact_values("What is 1 + 1?", "2", [0], 0.2)


def test_slips_are_judged_step_by_step_and_the_batch_rate_is_smoothed():
    assert step_errors(PROBLEM, RIGHT) == (0, 3)
    # + 6 = 5 is a slip; * 3 = 5 from the kept 5 is right (15 mod 10).
    assert step_errors(PROBLEM, WRONG) == (1, 3)
    assert batch_slip_rate([PROBLEM, PROBLEM], [RIGHT, WRONG]) == pytest.approx(2 / 8)
    assert batch_slip_rate([], []) == 0.5
    functions = exact_value_functions([{"problem": PROBLEM}] * 2, [RIGHT, WRONG])
    assert functions[0]([0]) == exact_values(PROBLEM, RIGHT, [0], 2 / 8)
    with pytest.raises(ValueError, match="synthetic task"):
        exact_value_functions([{"id": "x", "problem": "What is 1 + 1?"}], ["2"])


# -- σ from the exact values -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return (*synthetic_setup(), tmp_path_factory.mktemp("exact"))


def _exact_credit(setup, completion: str, advantage: float, outcome: float):
    cfg, tok, model, _, _ = setup
    assigner = CreditAssigner(tok, credit_config(cfg, "exact"))
    prompt = assigner.encode(f"Problem: {PROBLEM}\n<think>\n")
    ids = assigner.encode(completion) + [tok.eos_token_id]
    texts = assigner.token_texts(ids)
    values = exact_value_functions([{"problem": PROBLEM}], [assigner.completion_text(ids)])[0]
    model.eval()
    item = TraceInput(prompt, ids, advantage, [], outcome=outcome, task_values=values)
    (out,) = assigner.assign(model, [item])
    return texts, out


def test_right_traces_get_credit_where_the_value_rose_and_wrong_ones_blame_the_slip(setup):
    texts, right = _exact_credit(setup, RIGHT, 1.0, 1.0)
    n = len(texts)
    assert abs(float((right.multiplier / n).sum()) - 1.0) < 1e-5
    # Unlike the oracle's, a right trace's credit is not uniform: it follows the value's rises.
    assert not torch.allclose(right.multiplier, torch.ones_like(right.multiplier))
    assert (right.segment_rewards[:-1] > 0).all()
    texts, wrong = _exact_credit(setup, WRONG, -1.0, 0.0)
    ids = S.segment_ids_from_starts(wrong.segment_starts, len(texts))
    slip_char = WRONG.index("5.\nFinally")
    slip_token = next(t for t in range(len(texts)) if len("".join(texts[: t + 1])) > slip_char)
    k = int(ids[slip_token])
    assert int(wrong.segment_rewards.argmin()) == k  # the slip's segment loses the most value
    sigma = wrong.multiplier / len(texts)
    assert float(sigma[ids == k].mean()) > float(sigma[ids != k].max())


def test_the_method_needs_the_tasks_values_and_the_outcome():
    method = credit_method("exact")
    assert "task_values" in method.needs and "outcome" in method.needs and "rollouts" not in method.needs


def test_trainer_needs_the_task_values_and_uses_them(setup):
    with pytest.raises(ValueError, match="needs task_values="):
        arm_trainer(setup, "exact", rollout_reward=lambda row, text: 0.0)
    seen = []

    def values_of(rows, completions):
        seen.append(len(completions))
        return exact_value_functions(rows, completions)

    from rredcot.data.records import row_reward

    trainer, dataset = arm_trainer(setup, "exact", task_values=values_of, rollout_reward=row_reward)
    batch = one_credit_step(trainer, dataset)
    assert seen and seen[0] == 8  # every completion of the step's batch, for the slip rate
    assert_redistributed(batch)
