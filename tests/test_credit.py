"""Tests of the pure-torch credit-assignment core (rredcot.method.credit)."""

from __future__ import annotations

import ast
import math
import pkgutil
import re
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from numerics import entropy_tol

from rredcot.method.credit import (
    LOG_VALUE_FLOOR,
    entropy_multiplier,
    exit_log_values,
    pr_log_value,
    segment_rewards,
    token_entropies,
    token_multiplier,
    value_rewards,
)
from rredcot.method.registry import CREDIT_METHODS, NEEDS, credit_method, credit_multiplier

FAST = settings(max_examples=200, deadline=None)

# --------------------------------------------------------------------------------------------------
# PR-style value estimate
# --------------------------------------------------------------------------------------------------


def _worked_example() -> tuple[torch.Tensor, ...]:
    log_p_answer = torch.tensor([0.6, 0.2]).log()
    log_p_solution = torch.tensor([0.5, 0.4]).log()
    log_q = torch.tensor([0.5, 0.5]).log()
    utility = torch.tensor([1.0, 0.0])
    return log_p_solution, log_p_answer, log_q, utility


def test_pr_log_value_worked_example() -> None:
    args = _worked_example()
    assert pr_log_value(*args).item() == pytest.approx(math.log(0.3), rel=1e-6)


def test_pr_log_value_survives_tiny_probabilities() -> None:
    # Whole-solution probabilities of e^-2000 underflow any float; the log value must not.
    log_p_solution = torch.tensor([-2000.0, -2001.0])
    log_v = pr_log_value(log_p_solution, torch.zeros(2), torch.zeros(2), torch.ones(2))
    expected = torch.logsumexp(log_p_solution.double(), 0) - math.log(2)
    assert log_v.item() == pytest.approx(expected.item(), rel=1e-12)


def test_pr_log_value_broadcasts_over_exit_points() -> None:
    log_p_solution, log_p_answer, log_q, utility = _worked_example()
    # Three exit points: the worked example, the same shifted by log 2, and all pairs useless.
    lps = torch.stack([log_p_solution, log_p_solution + math.log(0.5), torch.full((2,), -math.inf)])
    values = pr_log_value(lps, log_p_answer, log_q, utility).exp()  # [3, 2] with [2]
    assert values.shape == (3,)
    torch.testing.assert_close(values, torch.tensor([0.3, 0.15, 0.0], dtype=torch.float64))


def test_pr_log_value_all_zero_utility() -> None:
    log_p_solution, log_p_answer, log_q, _ = _worked_example()
    # A zero-utility pair with log p = -inf must not produce NaN (-inf - -inf) either.
    log_p_solution = torch.tensor([-math.inf, -3.0])
    zero = torch.zeros(2)
    assert pr_log_value(log_p_solution, log_p_answer, log_q, zero).item() == -math.inf


def test_pr_log_value_rejects_negative_utility() -> None:
    with pytest.raises(ValueError):
        pr_log_value(torch.zeros(2), torch.zeros(2), torch.zeros(2), torch.tensor([1.0, -1.0]))


def test_segment_rewards_differences_and_inf() -> None:
    log_values = torch.tensor([-5.0, -3.0, -math.inf, -math.inf, -1.0], dtype=torch.float64)
    rewards = segment_rewards(log_values)
    assert rewards.shape == (4,)
    assert torch.isfinite(rewards).all()
    assert rewards[0].item() == 2.0
    assert rewards[1].item() == LOG_VALUE_FLOOR + 3.0
    assert rewards[2].item() == 0.0  # two zero values in a row
    assert rewards[3].item() == -1.0 - LOG_VALUE_FLOOR
    # The rewards telescope to the change of (clamped) value from the first exit to the last.
    assert rewards.sum().item() == pytest.approx(-1.0 - -5.0)


def test_segment_rewards_batched() -> None:
    log_values = torch.tensor([[0.0, 1.0, 3.0], [2.0, 2.0, 0.0]])
    torch.testing.assert_close(segment_rewards(log_values), torch.tensor([[1.0, 2.0], [0.0, -2.0]]))


def test_value_rewards_linear_are_value_changes_over_the_largest_value() -> None:
    log_values = torch.tensor([0.5, 0.4, 0.1], dtype=torch.float64).log()
    linear = value_rewards(log_values, "linear")
    torch.testing.assert_close(linear, torch.tensor([-0.2, -0.6], dtype=torch.float64))
    # The answer segment: the value after the model's own final solution is the exit's value times
    # the ratio, here 0.1 -> 0.05.
    with_answer = value_rewards(log_values, "linear", math.log(0.5))
    torch.testing.assert_close(with_answer, torch.tensor([-0.2, -0.6, -0.1], dtype=torch.float64))
    # Values far below float range keep their ratios; zero values are finite and differ by 0.
    tiny = value_rewards(
        torch.tensor([-900.0, -900.0 + math.log(0.25), -math.inf, -math.inf], dtype=torch.float64), "linear"
    )
    torch.testing.assert_close(tiny, torch.tensor([-0.75, -0.25, 0.0], dtype=torch.float64))
    assert value_rewards(torch.full((3,), -math.inf), "linear").abs().sum().item() == 0.0
    with pytest.raises(ValueError, match="value space"):
        value_rewards(log_values, "logit")


def test_value_rewards_log_are_segment_rewards_and_the_answer_ratio() -> None:
    log_values = torch.tensor([-5.0, -3.0, -math.inf, -1.0], dtype=torch.float64)
    assert torch.equal(value_rewards(log_values, "log"), segment_rewards(log_values))
    assert value_rewards(log_values, "log", -2.5).tolist() == [*segment_rewards(log_values).tolist(), -2.5]


@FAST
@given(
    st.lists(st.floats(-2000.0, 0.0), min_size=1, max_size=12),
    st.one_of(st.none(), st.floats(-50.0, 50.0)),
)
def test_value_rewards_linear_properties(log_values: list[float], ratio: float | None) -> None:
    """Linear rewards are finite, in [-1, 1], have the sign of the log rewards, and telescope to the
    change of value from the first exit to the last (in units of the largest value)."""
    linear = value_rewards(torch.tensor(log_values, dtype=torch.float64), "linear", ratio)
    log = value_rewards(torch.tensor(log_values, dtype=torch.float64), "log", ratio)
    assert linear.shape == log.shape and torch.isfinite(linear).all()
    assert (linear.abs() <= 1.0 + 1e-12).all()
    assert ((linear > 0) <= (log > 0)).all() and ((linear < 0) <= (log < 0)).all()
    tail = [log_values[-1] + ratio] if ratio is not None else []
    ext = torch.tensor([*log_values, *tail], dtype=torch.float64)
    v = (ext - ext.max()).exp()
    assert linear.sum().item() == pytest.approx((v[-1] - v[0]).item(), abs=1e-9)


def test_linear_blame_stays_on_the_step_that_lost_the_value() -> None:
    """A value that keeps falling after the step that went wrong (a reference solution scored against
    a trace that copies each later wrong value): log rewards blame the later, larger drop in nats,
    linear ones the step where the value was lost (log v̂ of a measured trace; the culprit is
    segment 1)."""
    log_values = torch.tensor([-3.97, -1.55, -14.67, -31.11, -36.97], dtype=torch.float64)
    ids = torch.repeat_interleave(torch.arange(4), 5)

    def top_blamed(space: str) -> int:
        mult = token_multiplier(ids, value_rewards(log_values, space), -1.0, mix=1.0)
        return int(ids[mult.argmax()])

    assert top_blamed("log") == 2
    assert top_blamed("linear") == 1


# --------------------------------------------------------------------------------------------------
# Token coefficient σ
# --------------------------------------------------------------------------------------------------


@st.composite
def _traces(draw: st.DrawFn) -> dict:
    """A random trace: segment layout with padding, rewards, advantage, mix and token weights."""
    lengths = draw(st.lists(st.integers(min_value=0, max_value=6), min_size=1, max_size=8))
    ids = [k for k, n in enumerate(lengths) for _ in range(n)]
    ids = ids + [-1] * draw(st.integers(min_value=0, max_value=5))
    # Ordinary magnitudes dominate so that most examples really redistribute credit; zeros, huge,
    # tiny and the LOG_VALUE_FLOOR-sized rewards are the edge cases.
    ordinary = st.floats(min_value=-20.0, max_value=20.0)
    reward = st.one_of(
        ordinary,
        ordinary,
        st.just(0.0),
        st.floats(min_value=-1e30, max_value=1e30),
        st.floats(min_value=-1e-30, max_value=1e-30),
        st.sampled_from([1e4, -1e4, 1e-300, -1e-300]),
    )
    rewards = draw(st.lists(reward, min_size=len(lengths), max_size=len(lengths)))
    sign = draw(st.sampled_from([1.0, -1.0, 1.0, -1.0, 0.0]))
    advantage = sign * draw(st.floats(min_value=1e-3, max_value=5.0))
    mix = draw(st.one_of(st.floats(min_value=0.05, max_value=1.0), st.sampled_from([0.0, 1.0])))
    weights = None
    if draw(st.booleans()):
        weight = st.one_of(st.just(0.0), st.floats(min_value=0.0, max_value=1e6, allow_nan=False))
        weights = torch.tensor(draw(st.lists(weight, min_size=len(ids), max_size=len(ids))))
    return {
        "segment_ids": torch.tensor(ids, dtype=torch.long),
        "segment_rewards": torch.tensor(rewards, dtype=torch.float64),
        "advantage": advantage,
        "mix": mix,
        "token_weights": weights,
    }


@FAST
@given(_traces())
def test_sigma_is_a_distribution_over_tokens(trace: dict) -> None:
    multiplier = token_multiplier(**trace)  # σ·|o|
    mask = trace["segment_ids"] >= 0
    n_tokens = int(mask.sum())
    assert multiplier.shape == mask.shape and multiplier.dtype == torch.float32
    assert torch.isfinite(multiplier).all() and (multiplier >= 0).all()
    assert (multiplier[~mask] == 0).all()
    if n_tokens:
        assert (multiplier[mask] / n_tokens).sum().item() == pytest.approx(1.0, abs=1e-5)


@FAST
@given(_traces())
def test_uniform_credit_is_exactly_grpo(trace: dict) -> None:
    mask = trace["segment_ids"] >= 0
    variants = [
        dict(trace, advantage=0.0),
        dict(trace, mix=0.0),
        dict(trace, segment_rewards=torch.zeros_like(trace["segment_rewards"])),
    ]
    for variant in variants:
        multiplier = token_multiplier(**variant)
        assert torch.equal(multiplier, mask.to(torch.float32))


def test_sigma_uniform_when_signs_disagree() -> None:
    # A correct trace whose segments only lowered the value has no positive credit to hand out.
    ids = torch.tensor([0, 0, 1, 1, 1])
    multiplier = token_multiplier(ids, torch.tensor([-1.0, -2.0]), advantage=1.0, mix=0.5)
    assert torch.equal(multiplier, torch.ones(5))


def test_sigma_credits_the_right_segment() -> None:
    ids = torch.tensor([0, 0, 1, 1, 1, 2, 2, -1, -1])
    rewards = torch.tensor([0.5, 2.0, -1.5])
    n_tokens = 7
    sigma = token_multiplier(ids, rewards, advantage=1.0, mix=1.0) / n_tokens
    per_segment = torch.stack([sigma[ids == k].sum() for k in range(3)])
    assert per_segment.argmax().item() == 1
    torch.testing.assert_close(per_segment, torch.tensor([0.2, 0.8, 0.0]))
    # Uniform within the segment.
    torch.testing.assert_close(sigma[2:5], torch.full((3,), 0.8 / 3))

    # A failed trace: the segment that lowered the value most takes the most blame.
    sigma = token_multiplier(ids, rewards, advantage=-0.7, mix=1.0) / n_tokens
    per_segment = torch.stack([sigma[ids == k].sum() for k in range(3)])
    assert per_segment.argmax().item() == 2
    torch.testing.assert_close(per_segment, torch.tensor([0.0, 0.0, 1.0]))

    # Mixing with uniform: σ = (1-λ)/|o| + λ·w_k/n_k.
    sigma = token_multiplier(ids, rewards, advantage=torch.tensor(2.0), mix=0.25) / n_tokens
    expected = torch.tensor(
        [0.75 / 7 + 0.25 * 0.2 / 2] * 2 + [0.75 / 7 + 0.25 * 0.8 / 3] * 3 + [0.75 / 7] * 2
    )
    torch.testing.assert_close(sigma[:7], expected)


def test_sigma_token_weights() -> None:
    ids = torch.tensor([0, 0, 1, 1, -1])
    rewards = torch.tensor([1.0, 3.0])
    weights = torch.tensor([1.0, 3.0, 0.0, 0.0, 5.0])
    sigma = token_multiplier(ids, rewards, advantage=1.0, mix=1.0, token_weights=weights) / 4
    # Segment 0 split 1:3 by weight; segment 1 has zero weights and falls back to uniform.
    torch.testing.assert_close(sigma, torch.tensor([0.25 * 0.25, 0.25 * 0.75, 0.375, 0.375, 0.0]))


def test_sigma_ignores_segments_without_tokens() -> None:
    # Segment 1 is absent (e.g. truncated away); its reward cannot be paid out to any token.
    ids = torch.tensor([0, 0, 2, 2])
    multiplier = token_multiplier(ids, torch.tensor([1.0, 5.0, 1.0]), advantage=1.0, mix=1.0)
    torch.testing.assert_close(multiplier, torch.ones(4))


def test_sigma_rejects_bad_input() -> None:
    ids = torch.tensor([0, 1])
    with pytest.raises(ValueError):
        token_multiplier(ids, torch.tensor([1.0, 2.0]), 1.0, mix=1.5)
    with pytest.raises(ValueError):
        token_multiplier(ids, torch.tensor([1.0]), 1.0, 0.5)
    with pytest.raises(ValueError):
        token_multiplier(ids, torch.tensor([1.0, math.nan]), 1.0, 0.5)


def test_sigma_all_padding() -> None:
    padding = torch.tensor([-1, -1])
    assert torch.equal(token_multiplier(padding, torch.tensor([1.0]), 1.0, 0.5), torch.zeros(2))


# --------------------------------------------------------------------------------------------------
# Token entropies
# --------------------------------------------------------------------------------------------------


def test_token_entropies_uniform_and_peaked() -> None:
    vocab = 37
    uniform = torch.zeros(2, 3, vocab)
    torch.testing.assert_close(token_entropies(uniform), torch.full((2, 3), math.log2(vocab)))
    peaked = torch.full((4, vocab), -1e4)
    peaked[torch.arange(4), torch.tensor([0, 5, 9, 36])] = 1e4
    assert token_entropies(peaked).abs().max().item() < 1e-6
    # -inf logits (masked vocabulary) contribute 0, not NaN.
    masked = torch.tensor([[0.0, 0.0, -math.inf, -math.inf]])
    torch.testing.assert_close(token_entropies(masked), torch.tensor([1.0]))


@pytest.mark.numerics
def test_token_entropies_bf16() -> None:
    logits = torch.randn(5, 64, generator=torch.Generator().manual_seed(0))
    out = token_entropies(logits.bfloat16())
    assert out.dtype == torch.float32
    # One rounding of each logit to bfloat16 moves each log p by at most twice u·max|z| (n = 1 and
    # the factor 2 of the helper; tests/numerics.py).
    bound = entropy_tol(1, 64, logit_scale=float(logits.abs().max()), dtype=torch.bfloat16)
    torch.testing.assert_close(out, token_entropies(logits), atol=bound, rtol=0.0)


# --------------------------------------------------------------------------------------------------
# Every credit method
# --------------------------------------------------------------------------------------------------


@st.composite
def _method_inputs(draw: st.DrawFn) -> dict:
    """A random unpadded trace with segments, segment rewards, entropies, advantage and mix."""
    lengths = draw(st.lists(st.integers(min_value=1, max_value=7), min_size=1, max_size=8))
    n = sum(lengths)
    ids = torch.tensor([k for k, m in enumerate(lengths) for _ in range(m)], dtype=torch.long)
    reward = st.one_of(st.floats(min_value=-30.0, max_value=30.0), st.just(0.0), st.sampled_from([1e4, -1e4]))
    rewards = torch.tensor(draw(st.lists(reward, min_size=len(lengths), max_size=len(lengths))))
    entropy = st.one_of(st.just(0.0), st.floats(min_value=0.0, max_value=17.0), st.just(1e-12))
    entropies = torch.tensor(draw(st.lists(entropy, min_size=n, max_size=n)))
    advantage = draw(st.sampled_from([1.0, -1.0, 0.0])) * draw(st.floats(min_value=1e-3, max_value=5.0))
    mix = draw(st.one_of(st.floats(min_value=0.0, max_value=1.0), st.sampled_from([0.0, 1.0])))
    return {
        "n": n,
        "ids": ids,
        "rewards": rewards,
        "entropies": entropies,
        "advantage": advantage,
        "mix": mix,
    }


@FAST
@given(_method_inputs(), st.sampled_from(sorted(CREDIT_METHODS)))
def test_every_credit_method_gives_a_distribution(x: dict, method: str) -> None:
    mult = credit_multiplier(method, x["n"], x["advantage"], x["mix"], x["ids"], x["rewards"], x["entropies"])
    sigma = mult.double() / x["n"]
    assert mult.shape == (x["n"],) and mult.dtype == torch.float32
    assert torch.isfinite(sigma).all() and (sigma >= 0).all()
    assert float(sigma.sum()) == pytest.approx(1.0, abs=1e-5)
    # mix 0 leaves a share of the advantage uniform; a method of the advantage form reads no mix.
    if method == "uniform" or (x["mix"] == 0.0 and credit_method(method).form == "share"):
        assert torch.equal(mult, torch.ones(x["n"]))


def test_entropy_weighting_follows_entropy() -> None:
    h = torch.tensor([0.0, 1.0, 3.0, 0.0])
    mult = entropy_multiplier(h, mix=1.0)
    torch.testing.assert_close(mult, torch.tensor([0.0, 1.0, 3.0, 0.0]))  # σ = H/ΣH, times |o| = 4
    half = entropy_multiplier(h, mix=0.5)
    torch.testing.assert_close(half, 0.5 + 0.5 * mult)
    assert torch.equal(entropy_multiplier(torch.zeros(3), 1.0), torch.ones(3))  # nothing to weight by
    # The sign of the advantage does not matter for entropy weighting.
    ids, rewards = torch.zeros(4, dtype=torch.long), torch.zeros(1)
    pos = credit_multiplier("entropy", 4, 1.0, 1.0, ids, rewards, h)
    assert torch.equal(pos, credit_multiplier("entropy", 4, -1.0, 1.0, ids, rewards, h))


def test_rredcot_entropy_spreads_segment_share_by_entropy() -> None:
    ids = torch.tensor([0, 0, 1, 1])
    rewards = torch.tensor([-2.0, 0.5])  # a correct trace: the second segment earned the credit
    h = torch.tensor([1.0, 1.0, 3.0, 1.0])
    plain = credit_multiplier("rredcot", 4, 1.0, 1.0, ids, rewards, h)
    weighted = credit_multiplier("rredcot+entropy", 4, 1.0, 1.0, ids, rewards, h)
    torch.testing.assert_close(plain, torch.tensor([0.0, 0.0, 2.0, 2.0]))
    torch.testing.assert_close(weighted, torch.tensor([0.0, 0.0, 3.0, 1.0]))


def test_credit_methods_reject_missing_inputs() -> None:
    with pytest.raises(ValueError, match="unknown credit method"):
        credit_multiplier("magic", 3, 1.0, 0.5)
    with pytest.raises(ValueError, match="entropies"):
        credit_multiplier("entropy", 3, 1.0, 0.5)
    with pytest.raises(ValueError, match="segment"):
        credit_multiplier("rredcot", 3, 1.0, 0.5, entropies=torch.ones(3))
    with pytest.raises(ValueError, match="entropies"):
        credit_multiplier("rredcot+entropy", 2, 1.0, 0.5, torch.tensor([0, 0]), torch.zeros(1))
    with pytest.raises(ValueError, match="2 entropies for 3 tokens"):
        credit_multiplier("entropy", 3, 1.0, 0.5, entropies=torch.ones(2))


def test_every_module_of_the_sources_package_is_imported_by_it() -> None:
    """A source module that ``rredcot.method.sources`` does not import registers nothing."""
    import rredcot.method.sources as sources

    modules = {m.name for m in pkgutil.iter_modules(sources.__path__)}
    tree = ast.parse(Path(sources.__file__).read_text())
    imported = {a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for a in node.names}
    assert modules, "no source modules found"
    assert modules <= imported, f"not imported by {sources.__name__}: {sorted(modules - imported)}"


def test_what_the_code_asks_a_method_to_need_is_a_registered_need() -> None:
    """``"culprit" in method.needs`` with a word outside ``NEEDS`` would be False for every method."""
    root = Path(__file__).resolve().parents[1]
    asked = {
        word
        for folder in ("src", "scripts", "tests")
        for path in (root / folder).rglob("*.py")
        for word in re.findall(r'"(\w+)" (?:not )?in [\w.]+\.needs\b', path.read_text())
    }
    assert asked and asked <= set(NEEDS), sorted(asked - set(NEEDS))


def test_exit_log_values_uniform_proposal_and_utilities() -> None:
    # Two pairs, uniform q = 1/2: v = (1/N) Σ p/q = Σ p, the worked example's numbers.
    lps = torch.tensor([[0.5, 0.4]]).log()
    lpa = torch.tensor([[0.6, 0.2]]).log()
    v = exit_log_values(lps, lpa, utility=torch.tensor([1.0, 0.0])).exp()
    assert float(v) == pytest.approx(0.3)
    assert float(exit_log_values(lps, lpa).exp()) == pytest.approx(0.3 + 0.08)
    with pytest.raises(ValueError, match="shape"):
        exit_log_values(torch.zeros(3), torch.zeros(3))
