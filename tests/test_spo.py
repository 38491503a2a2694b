"""SPO-chain (``spo``; Segment Policy Optimization, arXiv 2505.23564) against its paper's rule: cutpoints
where the policy's token probability is below the threshold, a boundary every ``interval`` cutpoints,
values from K rollouts at each, the change of value over a segment as its tokens' advantage (only the
cutpoints carry it), in place of the group's advantage; trained through the same trainer as the other
methods, and resumed bit for bit."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from synthetic_setup import (
    arm_trainer,
    assert_same_weights,
    crash_and_resume,
    one_credit_step,
    synthetic_setup,
)

from rredcot.method.assign import CreditAssigner, TraceCredit, paid_credit
from rredcot.method.registry import CreditMethod, TraceInput, credit_method
from rredcot.method.settings import CreditSettings, SpoSettings
from rredcot.method.sources import spo
from rredcot.settings.config import credit_config
from rredcot.viz.credit_view import write_views

PROBLEM = "Start at 9, times 2, add 6. Work mod 10."
TRACE = (
    "First, 9 * 2 = 8.\nNext, 8 + 6 = 4.\nCheck, 4 is the value.\nFinally, 4 it is.\n"
    "</think>\n9 * 2 = 8, 8 + 6 = 4. \\boxed{4}"
)


def spo_reference(
    probs: list[float], value_at, outcome: float, threshold: float, interval: int
) -> list[float]:
    """SPO-chain's token advantages written as SPO's episode generator walks a response: cutpoint
    states one token before each unsure token, every ``interval``-th kept; the value of each kept
    state on its token, the outcome on the last; differences walked forward from the first value,
    filled backward over the tokens between; tokens the policy is sure of zeroed (the probability
    mask). ``value_at(c)``: V of the prefix of length c. The last token is the EOS (never a cutpoint)."""
    n = len(probs)
    states = [t - 1 for t in range(n - 1) if probs[t] < threshold][::interval]
    if not states:
        return [0.0] * n
    token_values: list[float | None] = [None] * n
    token_values[-1] = outcome
    base = None
    if states[0] == -1:  # the first token is unsure: the prompt's own value is the base
        base = value_at(0)
        states = states[1:]
    for s in states:
        token_values[s] = value_at(s + 1)
    advantages: list[float | None] = [None] * n
    for i, v in enumerate(token_values):
        if v is not None:
            advantages[i] = 0.0 if base is None else v - base
            base = v
    for i in range(n - 2, -1, -1):
        if advantages[i] is None:
            advantages[i] = advantages[i + 1]
    return [0.0 if p >= threshold else float(a) for p, a in zip(probs, advantages, strict=True)]


# -- the rule on numbers -----------------------------------------------------------------------------
def test_cutpoints_are_the_tokens_below_the_threshold():
    probs = torch.tensor([0.95, 0.5, 0.9, 0.89, 1.0, 0.1, 0.2])
    assert spo.cutpoints(probs, 0.9) == [1, 3, 5, 6]  # 0.9 itself is not below 0.9
    assert spo.cutpoints(probs, 0.9, scored=6) == [1, 3, 5]  # the EOS is left out
    assert spo.cutpoints(probs, 0.0) == []


def test_a_boundary_falls_at_every_interval_th_cutpoint_from_the_first():
    points = [2, 4, 7, 9, 11, 13, 20]
    assert spo.boundaries(points, 5) == [2, 13]
    assert spo.boundaries(points, 2) == [2, 7, 11, 20]
    assert spo.boundaries(points, 1) == points
    assert spo.boundaries([], 5) == []
    # Too few for min_boundaries at interval 5: the largest interval that gives three (7 // 3 = 2).
    assert spo.boundaries(points, 5, min_boundaries=3) == [2, 7, 11, 20]
    assert spo.boundaries([3, 8], 5, min_boundaries=3) == [3, 8]  # every cutpoint, and no more
    assert spo.boundaries(points, 2, min_boundaries=3) == [2, 7, 11, 20]  # enough already


def test_each_segment_earns_its_change_of_value_and_the_last_the_outcome():
    starts, adv = spo.chain_advantages([0.5, 0.75], 0.0, [3, 6], 9)
    assert starts == [0, 3, 6]  # the tokens before the first boundary: a segment with advantage 0
    assert adv.tolist() == [0.0, 0.25, -0.75]
    token = spo.spread(starts, adv, 9)
    assert token.tolist() == [0.0] * 3 + [0.25] * 3 + [-0.75] * 3  # every token its segment's
    starts, adv = spo.chain_advantages([0.5, 0.75], 1.0, [0, 6], 9)  # a boundary at the prompt
    assert starts == [0, 6] and adv.tolist() == [0.25, 0.25]
    starts, adv = spo.chain_advantages([], 1.0, [], 4)  # no cutpoint: nothing to credit
    assert starts == [0] and adv.tolist() == [0.0]
    with pytest.raises(ValueError, match="increase strictly"):
        spo.chain_advantages([0.5, 0.5], 1.0, [4, 4], 9)


def test_whitening_centres_and_scales_over_the_cutpoints_of_every_trace():
    a = [torch.tensor([1.0, 2.0, 9.0], dtype=torch.float64), torch.tensor([3.0, 4.0], dtype=torch.float64)]
    masks = [torch.tensor([True, True, False]), torch.tensor([True, True])]
    out = spo.whiten(a, masks)
    pooled = torch.cat([out[0][:2], out[1]])
    torch.testing.assert_close(pooled.mean(), torch.tensor(0.0, dtype=torch.float64))
    torch.testing.assert_close(pooled.var(), torch.tensor(1.0, dtype=torch.float64), rtol=1e-6, atol=0.0)
    assert float(out[0][2]) == pytest.approx((9.0 - 2.5) / (5 / 3) ** 0.5, rel=1e-6)  # same affine map
    one = [torch.tensor([0.3], dtype=torch.float64)]
    assert spo.whiten(one, [torch.tensor([True])]) is one  # one value: no variance to divide by


def test_spo_is_a_method_of_the_advantage_form_reading_its_own_settings():
    method = credit_method("spo")
    assert method.form == "advantage" and not method.uniform
    assert method.needs == ("rollouts", "outcome")
    assert CreditSettings.read_by(method) == ("budget", "precision", "view_every", "view_samples", "spo")
    assert CreditMethod("x", "none", None, "").form == "share"  # existing calls keep their form
    assert SpoSettings() == SpoSettings(samples=9, threshold=0.9, interval=5, min_boundaries=1, whiten=True)
    with pytest.raises(ValueError):
        SpoSettings(interval=0)
    with pytest.raises(ValueError):
        SpoSettings(threshold=1.5)
    # σ of the advantage form: each token's share of the absolute advantage.
    shares = method.multiplier(4, 1.0, 0.5, torch.tensor([0, 0, 1, 1]), torch.tensor([1.0, -3.0]))
    assert shares.tolist() == [0.5, 0.5, 1.5, 1.5]
    credit = TraceCredit(shares, advantages=torch.tensor([1.0, 1.0, -3.0, -3.0]))
    assert paid_credit(credit, 7.0).tolist() == [1.0, 1.0, -3.0, -3.0]  # A is not multiplied in
    assert paid_credit(TraceCredit(torch.tensor([0.5, 1.5])), -2.0).tolist() == [-1.0, -3.0]


# -- in the assigner, on a tiny real policy --------------------------------------------------------------
@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    overrides = {"credit": {"spo": {"samples": 2, "max_new_tokens": 8, "batch_size": 16}}}
    return (*synthetic_setup(overrides), tmp_path_factory.mktemp("spo"))


def _trace(setup):
    cfg, tok, model, _, _ = setup
    model.eval()
    assigner = CreditAssigner(tok, credit_config(cfg, "spo"))
    prompt = assigner.encode(f"Problem: {PROBLEM}\n<think>\n")
    return assigner, model, prompt, assigner.encode(TRACE) + [tok.eos_token_id]


def test_probabilities_are_the_policys_teacher_forced_ones(setup):
    assigner, model, prompt, ids = _trace(setup)
    other = ids[:9]
    traces = [(prompt, ids), (prompt[:3], other), ([], other)]
    got = spo.completion_probabilities(model, traces)
    with torch.no_grad():
        for (p, c), probs in zip(traces, got, strict=True):
            logits = model(torch.tensor([p + c])).logits[0].float().log_softmax(-1)
            first = max(len(p), 1)  # with no prompt, no position predicts the first token
            want = logits[first - 1 : -1].gather(-1, torch.tensor((p + c)[first:])[:, None]).squeeze(-1)
            assert probs.shape == (len(c),) and probs[: len(c) - want.numel()].eq(1.0).all()
            torch.testing.assert_close(probs[len(c) - want.numel() :], want.exp(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("interval", [1, 3])
def test_the_assigner_gives_spo_chains_token_advantages(setup, interval):
    """Against SPO's own walk over the tokens, on the policy's probabilities, with deterministic
    rollout sums (the caller's input): a threshold at the median probability splits the tokens."""
    assigner, model, prompt, ids = _trace(setup)
    (probs,) = spo.completion_probabilities(model, [(prompt, ids)])
    threshold = float(probs[:-1].median())
    k = 4
    assigner.cfg = dataclasses.replace(
        assigner.cfg, spo=SpoSettings(samples=k, threshold=threshold, interval=interval, whiten=False)
    )

    def value_at(c: int) -> float:  # high early, a fall in the middle, partly back later
        return 1.0 if c < 15 else 0.25 if c < 30 else 0.5

    seen = []

    def rollouts(policy, items, cuts):
        seen.append(cuts)
        return [[k * value_at(c) for c in trace_cuts] for trace_cuts in cuts]

    item = TraceInput(prompt, ids, 1.0, [], outcome=1.0)
    (out,) = assigner.assign(model, [item], rollouts=rollouts)
    unsure = [t for t in range(len(ids) - 1) if probs[t] < threshold]
    assert seen == [[unsure[::interval]]] and out.cuts == unsure[::interval]  # one call, SPO's boundaries
    want = spo_reference(probs.tolist(), value_at, 1.0, threshold, interval)
    torch.testing.assert_close(out.advantages, torch.tensor(want), rtol=0.0, atol=1e-7)
    assert out.advantages.dtype == torch.float32 and torch.equal(paid_credit(out, 1.0), out.advantages)
    # Each segment's advantage on each of its unsure tokens; the sure ones get none.
    ends = [*out.segment_starts[1:], len(ids)]
    for a, b, r in zip(out.segment_starts, ends, out.segment_rewards.tolist(), strict=True):
        for t in range(a, b):
            assert float(out.advantages[t]) == pytest.approx(r if probs[t] < threshold else 0.0, abs=1e-7)
    torch.testing.assert_close(out.log_values.exp(), torch.tensor([value_at(c) for c in out.cuts]).double())
    # Signs follow the values, not the group's advantage (A = +1 here): the fall is blamed.
    assert (out.advantages < 0).any() and (out.advantages > 0).any()
    assert out.multiplier.sum().item() == pytest.approx(len(ids), rel=1e-5)  # σ: shares of |advantage|


def test_a_wrong_trace_gets_credit_where_its_values_rose(setup):
    assigner, model, prompt, ids = _trace(setup)
    assigner.cfg = dataclasses.replace(assigner.cfg, spo=SpoSettings(samples=2, threshold=1.0, interval=4))

    def rollouts(policy, items, cuts):  # values rise, then the trace ends wrong
        return [[2.0 * min(1.0, c / 20) for c in trace_cuts] for trace_cuts in cuts]

    items = [TraceInput(prompt, ids, a, [], outcome=0.0) for a in (-1.0, 0.0)]
    wrong, flat = assigner.assign(model, items, rollouts=rollouts)
    assert wrong.cuts == list(range(0, len(ids) - 1, 4))  # every token is unsure at threshold 1
    assert (wrong.segment_rewards[:-1] >= 0).all() and (wrong.segment_rewards[1:-1] > 0).any()
    assert wrong.segment_rewards[-1] < 0  # the end: from the last value down to the wrong outcome
    # Whitened over both traces' tokens: mean 0, and positive wherever the values rose most.
    pooled = torch.cat([wrong.advantages, flat.advantages]).double()
    assert abs(float(pooled.mean())) < 1e-5 and float(pooled.var()) == pytest.approx(1.0, rel=1e-4)
    assert torch.equal(wrong.advantages, flat.advantages)  # the group's advantage plays no part


def test_spo_needs_rollouts_and_outcomes(setup):
    assigner, model, prompt, ids = _trace(setup)
    with pytest.raises(ValueError, match="needs rollouts="):
        assigner.assign(model, [TraceInput(prompt, ids, 1.0, [], outcome=1.0)])
    with pytest.raises(ValueError, match="outcome"):
        assigner.assign(
            model, [TraceInput(prompt, ids, 1.0, [])], rollouts=lambda p, i, c: [[0.0] * len(c[0])]
        )
    with pytest.raises(ValueError, match="sums"):
        assigner.assign(
            model,
            [TraceInput(prompt, ids, 1.0, [], outcome=1.0)],
            rollouts=lambda p, i, c: [[99.0] * len(c[0])],
        )


# -- in the trainer ------------------------------------------------------------------------------------------
def _length_reward(row, text):  # noqa: ANN001, ANN202
    """A rollout reward in (0, 1] that varies with the text, so an untrained policy's values differ."""
    return 1.0 / (1 + len(text))


def test_trainer_applies_spos_own_token_advantages(setup):
    with pytest.raises(ValueError, match="needs rollout_reward="):
        arm_trainer(setup, "spo")
    trainer, dataset = arm_trainer(setup, "spo", rollout_reward=_length_reward)
    batch = one_credit_step(trainer, dataset)
    adv, mask = batch["advantages"], batch["completion_mask"].bool()
    assert adv.shape == mask.shape and torch.isfinite(adv).all()
    assert (adv[~mask] == 0).all()
    metrics = trainer._metrics["train"]
    assert metrics["credit/traces"][-1] == int(mask.any(dim=1).sum())  # every completion, whatever its A
    assert metrics["credit/rollouts"][-1] > 0 and metrics["credit/rollouts"][-1] % 2 == 0  # K = 2 each
    assert metrics["credit/seconds_probabilities"][-1] > 0
    # SPO's advantages, not shares of one sign: some completion holds both signs.
    assert any((adv[i][mask[i]] > 0).any() and (adv[i][mask[i]] < 0).any() for i in range(adv.shape[0]))
    # The step's credit pictures: SPO reads no entropies, so its records carry none, and its own
    # token advantages; they draw.
    views = trainer.credit_views
    assert views and all(v["entropies"] is None and len(v["advantages"]) == len(v["tokens"]) for v in views)
    assert write_views(views, setup[-1] / "views")


def test_spo_training_resumes_bit_for_bit(setup):
    """Two steps of SPO-chain straight, and cut short in the save of step 2 then resumed from step 1:
    the same weights (sampling, rollouts and optimizer come back)."""
    straight, resumed = crash_and_resume(setup, "spo", rollout_reward=_length_reward)
    assert_same_weights(straight.model, resumed.model, setup[2])
