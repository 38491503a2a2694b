"""PRIME's core (rredcot.method.prime) against its rule (Cui et al., arXiv 2502.01456, and its public
code), on hand-built tensors, and the PRM loss training a tiny real model."""

from __future__ import annotations

import math
import statistics

import pytest
import torch
from tiny_models import tiny_qwen

from rredcot.method.prime import (
    discounted_returns,
    implicit_reward_accuracy,
    implicit_token_rewards,
    leave_one_out,
    masked_whiten,
    normalise_process_rewards,
    prime_advantages,
    prm_loss,
)

D = torch.float64
NAN = float("nan")


def _mask(lengths: list[int], width: int) -> torch.Tensor:
    return torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


# --------------------------------------------------------------------------------------------------
# Implicit token rewards
# --------------------------------------------------------------------------------------------------

# Two completions, of 3 and 1 tokens; the padding holds garbage (NaN, huge) that must not leak.
PRM = torch.tensor([[-1.0, -2.0, -0.5, 1e9], [-0.3, NAN, NAN, NAN]], dtype=D)
REF = torch.tensor([[-1.5, -1.0, -0.5, -7.0], [-0.1, 0.0, NAN, 5.0]], dtype=D)
MASK = _mask([3, 1], 4)
# q = log π_φ − log π_ref on completion tokens: [[0.5, -1.0, 0.0], [-0.2]]


def test_token_rewards_are_beta_times_the_log_ratio_on_completion_tokens() -> None:
    rewards = implicit_token_rewards(PRM, REF, MASK, beta=0.05)
    expected = torch.tensor([[0.025, -0.05, 0.0, 0.0], [-0.01, 0.0, 0.0, 0.0]], dtype=D)
    torch.testing.assert_close(rewards, expected)


def test_token_rewards_scale_with_beta() -> None:
    small = implicit_token_rewards(PRM, REF, MASK, beta=0.05)
    large = implicit_token_rewards(PRM, REF, MASK, beta=0.2)
    torch.testing.assert_close(large, 4.0 * small)


def test_whole_granularity_puts_the_trace_sum_on_its_last_token() -> None:
    rewards = implicit_token_rewards(PRM, REF, MASK, beta=0.05, granularity="whole")
    expected = torch.tensor([[0.0, 0.0, -0.025, 0.0], [-0.01, 0.0, 0.0, 0.0]], dtype=D)
    torch.testing.assert_close(rewards, expected)


# --------------------------------------------------------------------------------------------------
# The PRM's loss
# --------------------------------------------------------------------------------------------------


def test_prm_loss_is_the_cross_entropy_of_the_sigmoid_of_beta_times_the_summed_ratio() -> None:
    beta = 0.5
    labels = torch.tensor([1.0, 0.0], dtype=D)
    loss = prm_loss(PRM, REF, MASK, labels, beta=beta)
    s0, s1 = beta * (0.5 - 1.0 + 0.0), beta * (-0.2)  # β·Σq per trace
    expected = (-math.log(_sigmoid(s0)) - math.log(1.0 - _sigmoid(s1))) / 2
    assert float(loss) == pytest.approx(expected, rel=1e-12)


def test_prm_loss_takes_soft_labels() -> None:
    labels = torch.tensor([0.25, 0.5], dtype=D)
    loss = prm_loss(PRM, REF, MASK, labels, beta=1.0)
    s0, s1 = -0.5, -0.2
    per = [
        -(y * math.log(_sigmoid(s)) + (1 - y) * math.log(1 - _sigmoid(s))) for s, y in ((s0, 0.25), (s1, 0.5))
    ]
    assert float(loss) == pytest.approx(sum(per) / 2, rel=1e-12)


def test_prm_loss_gradient_moves_the_prm_toward_the_label() -> None:
    beta = 0.05
    prm = PRM.clone().requires_grad_(True)
    ref = REF.clone().requires_grad_(True)
    labels = torch.tensor([1.0, 0.0], dtype=D)
    prm_loss(prm, ref, MASK, labels, beta=beta).backward()
    # ∂loss/∂log π_φ(y_t) = β·(σ(β·Σq) − label)/B on completion tokens, 0 on padding.
    g0 = beta * (_sigmoid(beta * -0.5) - 1.0) / 2
    g1 = beta * (_sigmoid(beta * -0.2) - 0.0) / 2
    expected = torch.tensor([[g0, g0, g0, 0.0], [g1, 0.0, 0.0, 0.0]], dtype=D)
    torch.testing.assert_close(prm.grad, expected)
    # Descent raises the right trace's log-probabilities and lowers the wrong one's.
    assert bool((prm.grad[0, :3] < 0).all()) and float(prm.grad[1, 0]) > 0
    assert ref.grad is None or not bool(ref.grad.any())  # the reference is frozen


def test_prm_loss_scales_its_logit_with_beta() -> None:
    labels = torch.tensor([1.0, 1.0], dtype=D)
    for beta in (0.05, 0.5, 2.0):
        expected = (-math.log(_sigmoid(beta * -0.5)) - math.log(_sigmoid(beta * -0.2))) / 2
        assert float(prm_loss(PRM, REF, MASK, labels, beta=beta)) == pytest.approx(expected, rel=1e-12)


# --------------------------------------------------------------------------------------------------
# Advantages
# --------------------------------------------------------------------------------------------------

# One group of K = 4 completions of lengths 3, 2, 3, 1; only the first is right.
LENGTHS = [3, 2, 3, 1]
GROUP = _mask(LENGTHS, 3)
PROCESS = torch.tensor(
    [
        [0.2, -0.1, 0.3],  # mean 2/15
        [0.1, 0.1, 99.0],  # mean 0.1 (99: padding)
        [-0.3, 0.0, 0.3],  # mean 0
        [0.4, -99.0, 99.0],  # mean 0.4
    ],
    dtype=D,
)
OUTCOMES = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=D)


def test_outcome_leave_one_out_is_plain_rloo_on_the_last_token() -> None:
    last = torch.zeros(4, 3, dtype=torch.bool)
    last[0, 2] = last[1, 1] = last[2, 2] = last[3, 0] = True
    rewards = OUTCOMES[:, None] * last
    out = leave_one_out(rewards, last, group_size=4)
    # o_i − mean_{j≠i} o_j: 1 − 0 for the right one, 0 − 1/3 for each wrong one.
    expected = torch.zeros(4, 3, dtype=D)
    expected[0, 2], expected[1, 1], expected[2, 2], expected[3, 0] = 1.0, -1 / 3, -1 / 3, -1 / 3
    torch.testing.assert_close(out, expected)


def test_process_leave_one_out_follows_prime() -> None:
    out = leave_one_out(PROCESS, GROUP, group_size=4)
    # r_t·K/(K−1) − Σ_j m_j/(K−1) with Σ_j m_j = 2/15 + 0.1 + 0 + 0.4 = 19/30.
    base = (19 / 30) / 3
    expected = torch.tensor(
        [
            [0.2 * 4 / 3 - base, -0.1 * 4 / 3 - base, 0.3 * 4 / 3 - base],
            [0.1 * 4 / 3 - base, 0.1 * 4 / 3 - base, 0.0],
            [-0.3 * 4 / 3 - base, -base, 0.3 * 4 / 3 - base],
            [0.4 * 4 / 3 - base, 0.0, 0.0],
        ],
        dtype=D,
    )
    torch.testing.assert_close(out, expected)
    # Summed over a trace: L_i·(m_i − mean_{j≠i} m_j), the paper's leave-one-out baseline per token.
    m = [2 / 15, 0.1, 0.0, 0.4]
    for i, n in enumerate(LENGTHS):
        loo = m[i] - (sum(m) - m[i]) / 3
        assert float(out[i].sum()) == pytest.approx(n * loo, rel=1e-12)


def test_discounted_returns_sum_the_rewards_to_go() -> None:
    rewards = torch.tensor([[1.0, 2.0, 4.0], [0.5, 0.0, 0.0]], dtype=D)
    torch.testing.assert_close(
        discounted_returns(rewards, gamma=1.0), torch.tensor([[7.0, 6.0, 4.0], [0.5, 0.0, 0.0]], dtype=D)
    )
    torch.testing.assert_close(
        discounted_returns(rewards, gamma=0.5), torch.tensor([[3.0, 4.0, 4.0], [0.5, 0.0, 0.0]], dtype=D)
    )


def _paper_returns(
    process: list[list[float]], outcomes: list[float], lengths: list[int], gamma_p: float, gamma_o: float
) -> list[list[float]]:
    """PRIME's returns of one group, computed element by element from its rule."""
    k = len(lengths)
    means = [sum(process[i][: lengths[i]]) / lengths[i] for i in range(k)]
    out = []
    for i, n in enumerate(lengths):
        shifted = [process[i][t] * k / (k - 1) - sum(means) / (k - 1) for t in range(n)]
        o = outcomes[i] - (sum(outcomes) - outcomes[i]) / (k - 1)
        row = []
        for t in range(n):
            g_p = sum(gamma_p ** (s - t) * shifted[s] for s in range(t, n))
            row.append(g_p + gamma_o ** (n - 1 - t) * o)
        out.append(row)
    return out


@pytest.mark.parametrize(("gamma_p", "gamma_o"), [(1.0, 1.0), (0.9, 0.5)])
def test_returns_match_the_rule_element_by_element(gamma_p: float, gamma_o: float) -> None:
    returns = prime_advantages(
        PROCESS,
        OUTCOMES,
        GROUP,
        4,
        normalise=False,
        whiten=False,
        process_gamma=gamma_p,
        outcome_gamma=gamma_o,
    )
    expected = _paper_returns(PROCESS.tolist(), OUTCOMES.tolist(), LENGTHS, gamma_p, gamma_o)
    for i, n in enumerate(LENGTHS):
        assert returns[i, :n].tolist() == pytest.approx(expected[i], rel=1e-12, abs=1e-12)
        assert not bool(returns[i, n:].any())


def test_one_right_answer_of_four_gets_the_outcome_advantage_on_every_token() -> None:
    outcome_only = prime_advantages(PROCESS, OUTCOMES, GROUP, 4, process_coef=0.0, whiten=False)
    for i, n in enumerate(LENGTHS):
        want = 1.0 if i == 0 else -1 / 3
        assert outcome_only[i, :n].tolist() == pytest.approx([want] * n)


def test_process_reward_and_outcome_can_disagree_in_sign() -> None:
    # The right trace's PRM rewards fall; a wrong trace's rise: each reward type pulls its own way
    # and the advantage is their sum.
    process = torch.tensor([[-0.4, -0.4], [0.4, 0.4], [0.0, 0.0], [0.0, 0.0]], dtype=D)
    outcomes = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=D)
    mask = _mask([2, 2, 2, 2], 2)
    kw = {"normalise": False, "whiten": False}
    both = prime_advantages(process, outcomes, mask, 4, **kw)
    process_only = prime_advantages(process, outcomes, mask, 4, outcome_coef=0.0, **kw)
    outcome_only = prime_advantages(process, outcomes, mask, 4, process_coef=0.0, **kw)
    assert bool((process_only[0] < 0).all()) and bool((outcome_only[0] > 0).all())
    assert bool((process_only[1] > 0).all()) and bool((outcome_only[1] < 0).all())
    torch.testing.assert_close(both, process_only + outcome_only)
    # By hand (means -0.4, 0.4, 0, 0; Σm = 0): r' = 4/3·r, returns to go 2·4/3·r, 4/3·r.
    torch.testing.assert_close(process_only[0], torch.tensor([-16 / 15, -8 / 15], dtype=D))
    # Weighted 5:1 toward the process reward, the right trace's first token turns negative.
    weighted = prime_advantages(process, outcomes, mask, 4, process_coef=5.0, **kw)
    assert float(weighted[0, 0]) == pytest.approx(5 * -16 / 15 + 1.0)


def test_normalisation_divides_by_the_largest_return_to_go() -> None:
    normalised = normalise_process_rewards(PROCESS, GROUP)
    # Returns to go (masked): row0 0.4, 0.2, 0.3; row1 0.2, 0.1; row2 0, 0.3, 0.3; row3 0.4. Max 0.4.
    expected = torch.where(GROUP, PROCESS, 0.0) / (0.4 + 1e-6)
    torch.testing.assert_close(normalised, expected)


def test_whitening_uses_the_batch_mean_and_unbiased_variance_of_completion_tokens() -> None:
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 50.0, -7.0]], dtype=D)
    mask = _mask([3, 1], 3)
    kept = [1.0, 2.0, 3.0, 4.0]
    mean, var = statistics.mean(kept), statistics.variance(kept)
    expected = [
        [(v - mean) / math.sqrt(var + 1e-8) for v in (1.0, 2.0, 3.0)],
        [(4.0 - mean) / math.sqrt(var + 1e-8)],
    ]
    out = masked_whiten(values, mask)
    assert out[0].tolist() == pytest.approx(expected[0], rel=1e-12)
    assert float(out[1, 0]) == pytest.approx(expected[1][0], rel=1e-12)
    assert not bool(out[1, 1:].any())


def test_prime_advantages_whiten_the_normalised_returns() -> None:
    advantages = prime_advantages(PROCESS, OUTCOMES, GROUP, 4)
    scale = 0.4 + 1e-6
    process = [[x / scale for x in row] for row in torch.where(GROUP, PROCESS, 0.0).tolist()]
    returns = _paper_returns(process, OUTCOMES.tolist(), LENGTHS, 1.0, 1.0)
    flat = [x for row in returns for x in row]
    mean, sd = statistics.mean(flat), math.sqrt(statistics.variance(flat) + 1e-8)
    for i, n in enumerate(LENGTHS):
        assert advantages[i, :n].tolist() == pytest.approx([(x - mean) / sd for x in returns[i]], rel=1e-10)
        assert not bool(advantages[i, n:].any())


def test_padding_holds_no_information() -> None:
    junk = PROCESS.clone()
    junk[~GROUP] = 1e6
    torch.testing.assert_close(
        prime_advantages(junk, OUTCOMES, GROUP, 4), prime_advantages(PROCESS, OUTCOMES, GROUP, 4)
    )


def test_normalised_advantages_do_not_depend_on_beta() -> None:
    prm = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, 0.0], [-2.0, -0.1, -0.4], [-0.9, 0.0, 0.0]], dtype=D)
    ref = torch.full_like(prm, -1.0)
    outs = [
        prime_advantages(implicit_token_rewards(prm, ref, GROUP, beta=b), OUTCOMES, GROUP, 4)
        for b in (0.05, 1.0)
    ]
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-4, atol=1e-4)  # the 1e-6 in the norm's divisor


def test_groups_are_consecutive_rows() -> None:
    # Two groups: swapping them swaps the outputs (no baseline crosses a group) when nothing is whitened.
    process = torch.cat([PROCESS, 0.5 * PROCESS.flip(0)])
    outcomes = torch.cat([OUTCOMES, torch.tensor([0.0, 1.0, 1.0, 0.5], dtype=D)])
    mask = torch.cat([GROUP, GROUP.flip(0)])
    kw = {"normalise": False, "whiten": False}
    both = prime_advantages(process, outcomes, mask, 4, **kw)
    torch.testing.assert_close(both[:4], prime_advantages(process[:4], outcomes[:4], mask[:4], 4, **kw))
    torch.testing.assert_close(both[4:], prime_advantages(process[4:], outcomes[4:], mask[4:], 4, **kw))


def test_pairwise_accuracy_counts_pairs_ranked_as_their_outcomes() -> None:
    mask = _mask([1, 1, 1, 1], 1)
    right_first = torch.tensor([[3.0], [1.0], [2.0], [0.0]])
    right_last = torch.tensor([[-3.0], [1.0], [2.0], [0.0]])
    outcomes = torch.tensor([1.0, 0.0, 0.0, 0.0])
    assert implicit_reward_accuracy(right_first, outcomes, mask, 4) == 1.0
    assert implicit_reward_accuracy(right_last, outcomes, mask, 4) == 0.0
    assert implicit_reward_accuracy(right_first, torch.zeros(4), mask, 4) == 0.5  # nothing to rank
    # Two groups: one ranked right, one wrong.
    both = torch.cat([right_first, right_last])
    assert implicit_reward_accuracy(both, torch.cat([outcomes, outcomes]), _mask([1] * 8, 1), 4) == 0.5


# --------------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------------


def test_bad_shapes_are_rejected_with_clear_errors() -> None:
    labels = torch.tensor([1.0, 0.0], dtype=D)
    with pytest.raises(ValueError, match="ref_log_probs"):
        implicit_token_rewards(PRM, REF[:, :3], MASK)
    with pytest.raises(ValueError, match=r"prm_log_probs must be \[B, T\]"):
        prm_loss(PRM[0], REF[0], MASK[0], labels)
    with pytest.raises(ValueError, match="mask must be"):
        prm_loss(PRM, REF, MASK[:, :3], labels)
    with pytest.raises(ValueError, match="labels must be"):
        prm_loss(PRM, REF, MASK, labels[:1])
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 1\]"):
        prm_loss(PRM, REF, MASK, torch.tensor([2.0, 0.0], dtype=D))
    with pytest.raises(ValueError, match="right padding"):
        implicit_token_rewards(PRM, REF, torch.tensor([[1, 0, 1, 0], [1, 0, 0, 0]]))
    with pytest.raises(ValueError, match="only 0 and 1"):
        implicit_token_rewards(PRM, REF, torch.full((2, 4), 0.5))
    with pytest.raises(ValueError, match="beta must be positive"):
        implicit_token_rewards(PRM, REF, MASK, beta=0.0)
    with pytest.raises(ValueError, match="granularity"):
        implicit_token_rewards(PRM, REF, MASK, granularity="step")
    with pytest.raises(ValueError, match="groups of 3"):
        prime_advantages(PROCESS, OUTCOMES, GROUP, 3)
    with pytest.raises(ValueError, match="at least 2"):
        prime_advantages(PROCESS, OUTCOMES, GROUP, 1)
    with pytest.raises(ValueError, match="outcomes must be"):
        prime_advantages(PROCESS, OUTCOMES[:3], GROUP, 4)
    with pytest.raises(ValueError, match="gamma"):
        discounted_returns(PROCESS, gamma=1.5)
    with pytest.raises(ValueError, match="two completion tokens"):
        masked_whiten(PROCESS, _mask([1, 0, 0, 0], 3))


# --------------------------------------------------------------------------------------------------
# A real optimisation: the PRM learns from outcome labels
# --------------------------------------------------------------------------------------------------


def _completion_log_probs(model: torch.nn.Module, ids: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """log p(token | prefix) of each completion token (positions prompt_len…end)."""
    logits = model(input_ids=ids).logits[:, prompt_len - 1 : -1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[:, prompt_len:, None]).squeeze(-1)


def test_prm_loss_steps_raise_the_implicit_reward_of_right_traces() -> None:
    vocab, prompt_len, width = 32, 3, 6
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(1, vocab, (2, prompt_len), generator=gen).repeat_interleave(4, dim=0)
    completions = torch.randint(1, vocab, (8, width), generator=gen)
    mask = _mask([6, 4, 5, 6, 3, 6, 2, 5], width)
    completions[~mask] = 0  # right padding
    ids = torch.cat([prompts, completions], dim=1)
    labels = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0])

    prm, ref = tiny_qwen(vocab, seed=3).train(), tiny_qwen(vocab, seed=3)
    ref.requires_grad_(False)
    with torch.no_grad():
        ref_lp = _completion_log_probs(ref, ids, prompt_len)

    def margin() -> tuple[float, float]:
        with torch.no_grad():
            rewards = implicit_token_rewards(_completion_log_probs(prm, ids, prompt_len), ref_lp, mask)
        sums = rewards.sum(dim=1)
        gap = float(sums[labels == 1].mean() - sums[labels == 0].mean())
        return gap, implicit_reward_accuracy(rewards, labels, mask, 4)

    assert margin()[0] == 0.0  # π_φ = π_ref: no reward yet
    opt = torch.optim.SGD(prm.parameters(), lr=1.0)
    losses = []
    for _ in range(8):
        opt.zero_grad()
        loss = prm_loss(_completion_log_probs(prm, ids, prompt_len), ref_lp, mask, labels)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    gap, accuracy = margin()
    assert losses[0] == pytest.approx(math.log(2.0))  # σ(0) against every label
    assert all(b < a for a, b in zip(losses, losses[1:], strict=False)), losses
    assert gap > 0.0
    assert accuracy == 1.0  # within each group, every right trace above every wrong one
