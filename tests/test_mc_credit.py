"""The Monte Carlo credit arm: values at RREDCoT's exit points from policy rollouts (VinePPO-style),
through the same segment-reward-to-σ mapping."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from synthetic_setup import arm_trainer, assert_redistributed, one_credit_step, synthetic_setup

from rredcot.data.records import rl_records, row_reward
from rredcot.lm.rollouts import PolicyRollouts
from rredcot.method import credit as C
from rredcot.method import segmentation as S
from rredcot.method.assign import CreditAssigner, credit_record
from rredcot.method.registry import TraceInput
from rredcot.method.settings import MonteCarloSettings
from rredcot.settings.config import credit_config
from rredcot.viz.credit_record import validate_record

PROBLEM = "Start at 9, times 2, add 6. Work mod 10."
COPIED = (
    "First, 9 * 2 = 8.\nNext, 8 + 6 = 5.\nCheck, 5 is the value.\nFinally, 5 it is.\n"
    "</think>\n9 * 2 = 8, 8 + 6 = 5. \\boxed{5}"
)


# -- values ---------------------------------------------------------------------------------------------
def test_mc_log_values_are_laplace_smoothed_means():
    got = C.mc_log_values([0, 2, 4], 4).exp()
    assert torch.allclose(got, torch.tensor([1 / 6, 3 / 6, 5 / 6], dtype=torch.float64))
    with pytest.raises(ValueError, match="outcome sums"):
        C.mc_log_values([5], 4)
    with pytest.raises(ValueError, match="at least one"):
        C.mc_log_values([0], 0)


@settings(max_examples=200, deadline=None)
@given(m=st.integers(1, 64), data=st.data())
def test_mc_values_are_finite_ordered_and_inside_0_1(m, data):
    sums = data.draw(st.lists(st.floats(0.0, float(m)), min_size=1, max_size=10))
    log_v = C.mc_log_values(sums, m)
    assert torch.isfinite(log_v).all() and (log_v < 0).all()
    order = sorted(range(len(sums)), key=lambda i: sums[i])
    assert all(log_v[a] <= log_v[b] for a, b in zip(order, order[1:], strict=False))


# -- in the assigner --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return (
        *synthetic_setup({"credit": {"mc": {"samples": 3, "max_new_tokens": 24}}}),
        tmp_path_factory.mktemp("mc"),
    )


def test_the_segment_where_rollouts_stop_succeeding_takes_the_blame(setup):
    cfg, tok, model, _, _ = setup
    assigner = CreditAssigner(tok, credit_config(cfg, "mc"))
    prompt = assigner.encode(f"Problem: {PROBLEM}\n<think>\n")
    ids = assigner.encode(COPIED) + [tok.eos_token_id]
    seen = {}

    def rollouts(policy, items, cuts):
        # Every rollout succeeds before the second cut and fails from it on: segment 1 lost the value.
        seen["cuts"] = cuts
        m = assigner.cfg.mc.samples
        return [[float(m) if i < 2 else 0.0 for i in range(len(c))] for c in cuts]

    model.eval()
    item = TraceInput(prompt, ids, -1.0, [], outcome=0.0)
    with pytest.raises(ValueError, match="needs rollouts="):
        assigner.assign(model, [item])
    (out,) = assigner.assign(model, [item], rollouts=rollouts)
    n = len(ids)
    cuts = seen["cuts"][0]
    assert out.cuts == cuts and len(cuts) >= 4 and cuts[0] == 0
    # The exit points are RREDCoT's: the thinking segments end where the model exits.
    texts = assigner.token_texts(ids)
    assert cuts[-1] == S.thinking_end(texts, "</think>\n") == out.segment_starts[-1]
    seg = S.segment_ids_from_starts(out.segment_starts, n)
    sigma = out.multiplier / n
    assert abs(float(sigma.sum()) - 1.0) < 1e-5 and (sigma >= 0).all()
    inside, outside = sigma[seg == 1], sigma[seg != 1]
    assert float(inside.min()) > float(outside.max())
    # A wrong outcome at an exit whose rollouts all fail already: the answer segment is not blamed.
    assert out.answer_reward == pytest.approx(0.0, abs=1e-12)
    assert torch.allclose(out.log_values.exp()[:2], torch.full((2,), 4 / 5, dtype=torch.float64))
    # The credit view takes it: values at every cut, no teacher-forced NLLs.
    record = credit_record(texts, out, "mc", 0, "t", PROBLEM, "4", -1.0)
    validate_record(record)
    assert record["thought_nll"] is None and len(record["log_values"]) == len(cuts)


def test_a_right_answer_after_hopeless_thinking_credits_the_answer_segment(setup):
    cfg, tok, model, _, _ = setup
    assigner = CreditAssigner(tok, credit_config(cfg, "mc"))
    prompt = assigner.encode(f"Problem: {PROBLEM}\n<think>\n")
    ids = assigner.encode(COPIED) + [tok.eos_token_id]
    model.eval()
    (out,) = assigner.assign(
        model,
        [TraceInput(prompt, ids, 1.0, [], outcome=1.0)],
        rollouts=lambda policy, items, cuts: [[0.0] * len(c) for c in cuts],
    )
    n = len(ids)
    seg = S.segment_ids_from_starts(out.segment_starts, n)
    answer = len(out.segment_starts) - 1
    assert out.answer_reward == pytest.approx(math.log(4 / 5) - math.log(1 / 5))
    sigma = out.multiplier / n
    assert float(sigma[seg == answer].min()) > float(sigma[seg != answer].max())


def test_settings_refuse_empty_rollouts():
    with pytest.raises(ValueError):
        MonteCarloSettings(samples=0)
    with pytest.raises(ValueError):
        MonteCarloSettings(max_new_tokens=0)


# -- in the trainer -----------------------------------------------------------------------------------------
def test_trainer_samples_rollouts_from_every_exit_point_and_logs_their_cost(setup):
    with pytest.raises(ValueError, match="needs rollout_reward="):
        arm_trainer(setup, "mc")
    scored = []

    def reward(row, text):
        scored.append(text)
        return row_reward(row, text)

    trainer, dataset = arm_trainer(setup, "mc", rollout_reward=reward)
    batch = one_credit_step(trainer, dataset)
    rollouts = trainer._metrics["train"]["credit/rollouts"][-1]
    tokens = trainer._metrics["train"]["credit/rollout_tokens"][-1]
    traces = trainer._metrics["train"]["credit/traces"][-1]
    segments = trainer._metrics["train"]["credit/segments"][-1]
    assert traces > 0 and rollouts % 3 == 0  # M = 3 rollouts at every distinct exit point
    assert 0 < tokens <= 24 * rollouts
    # Each trace's own outcome, then M rollouts scored at every exit point of every trace; the
    # traces of a group share their prompt (exit 0), whose rollouts are generated once.
    judged = len(scored) - traces
    assert judged % 3 == 0 and judged >= 3 * 2 * traces and rollouts <= judged
    assert segments >= 1
    assert_redistributed(batch)


def test_traces_sharing_a_prefix_share_its_rollouts(setup):
    """A group's traces share their prompt: its rollouts are generated once and graded once per row;
    the same prefix under another label (a duplicated problem) is graded against that label."""
    scored = []
    cfg, tok, model, splits, _ = setup
    dataset = rl_records(splits["rl"], cfg["prompt"]["template"])

    def rollouts(rows):  # noqa: ANN202
        def reward(j, text):  # noqa: ANN202
            scored.append((rows[j]["answer"], text))
            return row_reward(rows[j], text)

        keys = [repr(sorted(row.items())) for row in rows]
        sampling = {"temperature": 1.0, "top_p": 1.0, "seed": (0,)}
        return PolicyRollouts(tok, reward, keys, samples=3, batch_size=8, max_new_tokens=8, **sampling)

    model.eval()
    prompt = tok(dataset[0]["prompt"], add_special_tokens=False)["input_ids"]
    first = tok("First,", add_special_tokens=False)["input_ids"]
    other = tok("Now,", add_special_tokens=False)["input_ids"]
    items = [TraceInput(prompt, first + [tok.eos_token_id], -1.0, []), TraceInput(prompt, other, 1.0, [])]
    cuts = [[0, len(first)], [0, len(other)]]
    sampler = rollouts([dataset[0], dataset[0]])
    sums = sampler(model, items, cuts)
    assert sampler.rollouts == 3 * 3  # three distinct prefixes, M = 3 each
    assert len(scored) == 3 * 3  # each distinct prefix's M rollouts are graded once
    assert sums[0][0] == sums[1][0]  # the shared prompt's rollouts, scored alike
    assert all(0 <= v <= 3 for trace in sums for v in trace)

    # The same problem under another label: same prefixes, so the same rollouts, graded twice.
    relabelled = {**dataset[0], "answer": str((int(dataset[0]["answer"]) + 1) % 10)}
    scored.clear()
    sampler = rollouts([dataset[0], relabelled])
    sums = sampler(model, [items[0], items[0]], [cuts[0]] * 2)
    assert sampler.rollouts == 2 * 3  # two distinct prefixes, generated once
    assert len(scored) == 2 * 2 * 3  # ... and graded against each label
    assert {a for a, _ in scored} == {dataset[0]["answer"], relabelled["answer"]}
