"""Pure-torch core of PRIME (Process Reinforcement through IMplicit rEwards, Cui et al., arXiv
2502.01456): token rewards from an implicit process reward model (PRM), the PRM's loss on outcome
labels, and PRIME's combination of process and outcome rewards into token advantages.

The rule, as PRIME's public code (PRIME-RL/PRIME, its verl trainer) applies it:

- **Implicit PRM.** A causal LM π_φ, initialised from the SFT model, beside a frozen reference
  π_ref, the same SFT model. Over the completion tokens only (the prompt is never scored), the
  log-ratio ``q_t = log π_φ(y_t | x, y_<t) − log π_ref(y_t | x, y_<t)``; the paper's token reward is
  ``r_t = β·q_t`` (``implicit_token_rewards``). Padding after a completion's end gets no reward.
  Granularity ``token`` (PRIME's default) rewards every token; ``whole`` puts the trace's sum
  ``β·Σ_t q_t`` on its last token.
- **PRM loss.** Cross-entropy between ``σ(β·Σ_t q_t)`` and the trace's outcome label (PRIME's
  ``ce`` loss, its only one), averaged over the traces (``prm_loss``). The reference is frozen, so
  the gradient flows through log π_φ alone.
- **PRM update.** Every policy step, on that step's rollouts and their verifier labels: one pass in
  mini-batches (``reward_model.mini_batch_size``, 256 rollouts), one AdamW step each. PRIME's recipe
  uses ``update: after``: the rewards the policy is trained on come from the same PRM forward that
  computes each mini-batch's loss, i.e. before that mini-batch's optimizer step (``before``
  recomputes them after the update).
- **Process reward normalisation** (``prime_norm: batch_norm``, PRIME's default;
  ``normalise_process_rewards``): the token rewards are divided by ``max |Σ_{s≥t} r_s| + 1e-6``
  over the batch, so that no process return exceeds 1 in magnitude. This makes β irrelevant to the
  advantages: PRIME's code in fact passes ``q_t`` without β to this step.
- **Leave-one-out baselines** (``leave_one_out``), over the K samples of a prompt, separately for
  each reward type. The outcome reward r_o sits on the trace's last token and gets plain RLOO,
  ``r_o(i) − mean_{j≠i} r_o(j)``. A process token reward gets
  ``r_t·K/(K−1) − Σ_j m_j/(K−1)``, m_j the mean token reward of sample j: the leave-one-out baseline
  of the per-token means, ``r_t − mean_{j≠i} m_j``, plus ``(r_t − m_i)/(K−1)``, a term that sums to 0
  over the trace (the paper and PRIME's README describe subtracting the baseline alone; its code
  adds this term, and this module follows the code).
- **Returns** (``discounted_returns``): for each reward type, ``G_t = Σ_{s≥t} γ^{s−t} r'_s`` with
  γ = 1 for both (``verifier_gamma``, ``reward_model_gamma``). The outcome's return is thus its
  leave-one-out advantage on every token of the trace.
- **Advantages** (``prime_advantages``): the sum of the two returns, whitened over every completion
  token of the batch (mean 0, unbiased variance 1, ``masked_whiten``).

Defaults (PRIME's recipe, the 7B run that gave Eurus-2-7B-PRIME), for the settings tree to mirror:

- β = 0.05 (``beta_train``); granularity ``token``; normalisation ``batch_norm`` (on);
- γ = 1 for both reward types; coefficients 1 and 1: PRIME's config sets ``rm_coef`` 5 and the
  verifier's ``reward_coef`` 5, but its RLOO estimator sums the two returns unweighted (the
  coefficients enter only a combined reward it does not read), and after whitening only their ratio
  matters, which is 1 either way;
- K = 4 samples per prompt (``n_samples``), and only prompts whose K samples score a mean accuracy
  in [0.2, 0.8] are kept (an online prompt filter, part of the trainer, not of the credit rule);
- the PRM's optimizer: AdamW, lr 1e-6, betas (0.9, 0.999), weight decay 0, gradient norm clipped
  at 10, constant schedule without warmup; PRM and reference both loaded from the SFT model, the
  reference frozen;
- the policy: lr 5e-7, no KL penalty (coefficient 0), PPO clip loss on the whitened advantages.

Where our setting differs:

- **Groups.** A group is ``group_size`` consecutive rows, as TRL orders GRPO's ``num_generations``
  completions of a prompt (PRIME's ``n_samples`` are consecutive too).
- **Outcome.** Our outcome reward lies in [0, 1]; it is both the PRM's label (binary
  cross-entropy accepts a soft label; PRIME's are 0/1) and the outcome reward.
- **Batch statistics.** Normalisation and whitening run over the batch the caller passes; PRIME
  normalises per data-parallel worker's share and whitens over the whole batch.
- **Empty completions** (all padding) get no advantage; their process mean counts as 0 and their
  outcome, which sits on no token, as 0 in their group's baseline (PRIME's responses are never
  empty).

Tensors are [B, T] over completion tokens (B rows, T the longest completion), right-padded: each
row of ``mask`` is a run of ones (the completion, EOS included) followed by zeros.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from rredcot.method.credit import whitening

NORMALISE_EPS: float = 1e-6
"""Added to the largest |process return| before dividing by it, as PRIME's ``batch_norm`` adds it."""


GRANULARITIES = ("token", "whole")


# --------------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------------


def _as_mask(mask: Tensor, shape: torch.Size) -> Tensor:
    """``mask`` as bool, after checking it is [B, T] of ``shape``, 0/1, and right-padded."""
    if mask.dim() != 2 or mask.shape != shape:
        raise ValueError(f"mask must be [B, T] = {list(shape)}, got {list(mask.shape)}")
    if mask.dtype != torch.bool:
        if not bool(((mask == 0) | (mask == 1)).all()):
            raise ValueError("mask must hold only 0 and 1")
        mask = mask.bool()
    if bool((mask[:, 1:] & ~mask[:, :-1]).any()):
        raise ValueError("each row of mask must be ones followed by zeros (right padding)")
    return mask


def _check_pair(prm_log_probs: Tensor, ref_log_probs: Tensor) -> None:
    if prm_log_probs.dim() != 2:
        raise ValueError(f"prm_log_probs must be [B, T], got {list(prm_log_probs.shape)}")
    if ref_log_probs.shape != prm_log_probs.shape:
        raise ValueError(
            f"ref_log_probs {list(ref_log_probs.shape)} must match prm_log_probs {list(prm_log_probs.shape)}"
        )


def _check_rows(name: str, values: Tensor, rows: int) -> None:
    if values.shape != (rows,):
        raise ValueError(f"{name} must be [B] = [{rows}], one per row, got {list(values.shape)}")


def _check_groups(rows: int, group_size: int) -> None:
    if group_size < 2:
        raise ValueError(f"group_size must be at least 2 for a leave-one-out baseline, got {group_size}")
    if rows % group_size:
        raise ValueError(f"{rows} rows do not split into groups of {group_size} consecutive rows")


def _float(x: Tensor) -> Tensor:
    """``x`` in a floating dtype of at least float32's precision."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


# --------------------------------------------------------------------------------------------------
# The implicit PRM: its token rewards and its loss
# --------------------------------------------------------------------------------------------------


def log_ratio(prm_log_probs: Tensor, ref_log_probs: Tensor, mask: Tensor) -> Tensor:
    """``q_t = log π_φ(y_t) − log π_ref(y_t)`` on completion tokens, 0 on padding (whatever the
    log-probabilities hold there); differentiable in ``prm_log_probs``, constant in the reference."""
    _check_pair(prm_log_probs, ref_log_probs)
    mask = _as_mask(mask, prm_log_probs.shape)
    diff = prm_log_probs - ref_log_probs.detach()
    return torch.where(mask, diff, torch.zeros_like(diff))


@torch.no_grad()
def implicit_token_rewards(
    prm_log_probs: Tensor,
    ref_log_probs: Tensor,
    mask: Tensor,
    beta: float = 0.05,
    granularity: str = "token",
) -> Tensor:
    """The implicit PRM's process rewards [B, T]: ``β·q_t`` on each completion token
    (``token``), or ``β·Σ_t q_t`` on the last token of each completion (``whole``); 0 elsewhere."""
    if beta <= 0:
        raise ValueError(f"beta must be positive, got {beta}")
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    rewards = beta * _float(log_ratio(prm_log_probs, ref_log_probs, mask))
    if granularity == "token":
        return rewards
    return rewards.sum(dim=1, keepdim=True) * last_token(_as_mask(mask, rewards.shape))


def prm_loss(
    prm_log_probs: Tensor,
    ref_log_probs: Tensor,
    mask: Tensor,
    labels: Tensor,
    beta: float = 0.05,
) -> Tensor:
    """PRIME's PRM loss: mean over traces of the binary cross-entropy between
    ``σ(β·Σ_t q_t)`` and the trace's label in [0, 1] (its outcome).

    A scalar, differentiable in ``prm_log_probs``: ``∂loss/∂log π_φ(y_t) = β·(σ(β·Σq) − label)/B``
    on each completion token, so a gradient step raises the log-probabilities of traces labelled 1
    and lowers those of traces labelled 0. Computed from the logit ``β·Σq`` (the same loss as
    PRIME's cross-entropy on the sigmoid, without its log clamp at −100)."""
    if beta <= 0:
        raise ValueError(f"beta must be positive, got {beta}")
    q = log_ratio(prm_log_probs, ref_log_probs, mask)
    _check_rows("labels", labels, q.shape[0])
    if bool(((labels < 0) | (labels > 1)).any()):
        raise ValueError("labels must lie in [0, 1]")
    logits = beta * q.sum(dim=1)
    return F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype))


@torch.no_grad()
def implicit_reward_accuracy(token_rewards: Tensor, outcomes: Tensor, mask: Tensor, group_size: int) -> float:
    """How often the PRM ranks two samples of a prompt as their outcomes do (PRIME's
    ``dpo_acc``): over the pairs of each group, weighted by their outcome gap, the fraction whose
    summed rewards differ in the outcomes' direction (a tie counts as ranking the second sample
    higher, as in PRIME); 0.5 for a group whose outcomes all agree; the mean over groups."""
    mask = _as_mask(mask, token_rewards.shape)
    _check_rows("outcomes", outcomes, mask.shape[0])
    _check_groups(mask.shape[0], group_size)
    scores = _float(torch.where(mask, token_rewards, 0.0)).sum(dim=1).view(-1, group_size)
    acc = _float(outcomes).view(-1, group_size)
    upper = torch.triu(torch.ones(group_size, group_size, dtype=torch.bool, device=scores.device), diagonal=1)
    score_gap = (scores[:, :, None] - scores[:, None, :])[:, upper]
    acc_gap = (acc[:, :, None] - acc[:, None, :])[:, upper]
    weight = acc_gap.abs()
    agree = ((score_gap > 0) == (acc_gap > 0)).to(weight.dtype)
    total = weight.sum(dim=1)
    per_group = torch.where(total > 0, (agree * weight).sum(dim=1) / total.clamp(min=1e-30), 0.5)
    return float(per_group.mean())


# --------------------------------------------------------------------------------------------------
# Advantages: normalisation, leave-one-out baselines, returns, whitening
# --------------------------------------------------------------------------------------------------


def last_token(mask: Tensor) -> Tensor:
    """[B, T] bool: the last completion token of each row (none for an empty row)."""
    lengths = mask.sum(dim=1)
    positions = torch.arange(mask.shape[1], device=mask.device)
    return positions[None, :] == (lengths - 1)[:, None]


def normalise_process_rewards(token_rewards: Tensor, mask: Tensor) -> Tensor:
    """PRIME's ``batch_norm``: the masked rewards over ``max_{i,t} |Σ_{s≥t} r_{i,s}| + 1e-6``,
    the largest undiscounted process return of the batch (scale-free: β cancels)."""
    mask = _as_mask(mask, token_rewards.shape)
    rewards = torch.where(mask, _float(token_rewards), 0.0)
    to_go = rewards.flip(dims=[1]).cumsum(dim=1).flip(dims=[1])
    return rewards / (to_go.abs().max() + NORMALISE_EPS)


def leave_one_out(rewards: Tensor, reward_mask: Tensor, group_size: int) -> Tensor:
    """PRIME's RLOO for one reward type, over groups of ``group_size`` consecutive rows: each
    rewarded position's ``r·K/(K−1) − Σ_j m_j/(K−1)``, m_j the mean reward over the rewarded
    positions of the group's row j (0 for a row with none); 0 where ``reward_mask`` is False.

    With one rewarded position per row (the outcome) this is plain RLOO, ``r_i − mean_{j≠i} r_j``."""
    if rewards.dim() != 2 or reward_mask.shape != rewards.shape:
        raise ValueError(
            f"rewards and reward_mask must be [B, T] of one shape, got {list(rewards.shape)}, "
            f"{list(reward_mask.shape)}"
        )
    _check_groups(rewards.shape[0], group_size)
    k = group_size
    kept = torch.where(reward_mask, _float(rewards), 0.0)
    means = kept.sum(dim=1) / reward_mask.sum(dim=1).clamp(min=1)
    group_sums = means.view(-1, k).sum(dim=1).repeat_interleave(k)
    shifted = kept * (k / (k - 1)) - (group_sums / (k - 1))[:, None]
    return torch.where(reward_mask, shifted, 0.0)


def discounted_returns(rewards: Tensor, gamma: float = 1.0) -> Tensor:
    """``G_t = r_t + γ·G_{t+1}`` along each row (``G`` after the last column is 0)."""
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [B, T], got {list(rewards.shape)}")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must lie in [0, 1], got {gamma}")
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in range(rewards.shape[1] - 1, -1, -1):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
    return returns


def masked_whiten(values: Tensor, mask: Tensor) -> Tensor:
    """``(v − mean) / sqrt(var + 1e-8)`` with the mean and unbiased variance over the masked
    entries of the whole batch; 0 outside the mask. Needs at least two masked entries."""
    mask = _as_mask(mask, values.shape)
    n = int(mask.sum())
    if n < 2:
        raise ValueError(f"whitening needs at least two completion tokens in the batch, got {n}")
    mean, scale = whitening(_float(values)[mask])
    whitened = (_float(values) - mean) * scale
    return torch.where(mask, whitened, 0.0)


@torch.no_grad()
def prime_advantages(
    token_rewards: Tensor,
    outcomes: Tensor,
    mask: Tensor,
    group_size: int,
    *,
    process_coef: float = 1.0,
    outcome_coef: float = 1.0,
    process_gamma: float = 1.0,
    outcome_gamma: float = 1.0,
    normalise: bool = True,
    whiten: bool = True,
) -> Tensor:
    """PRIME's token advantages [B, T] from process rewards [B, T] and outcomes [B].

    For trace i of a group of K = ``group_size`` consecutive rows, with process rewards ``r_t``
    (normalised by ``normalise_process_rewards`` when ``normalise``), their per-trace means m_j and
    outcomes o_j::

        r'_t  = r_t·K/(K−1) − Σ_j m_j/(K−1)                  (process, every token)
        o'_i  = o_i − Σ_{j≠i} o_j/(K−1)                       (outcome, on the last token)
        R_t   = c_p·Σ_{s≥t} γ_p^{s−t} r'_s + c_o·γ_o^{L_i−1−t}·o'_i
        A_t   = (R_t − mean R) / sqrt(var R + 1e-8)           (over every completion token)

    with c_p, c_o = ``process_coef``, ``outcome_coef`` and L_i the trace's length; ``whiten`` False
    returns R. 0 on padding. PRIME's defaults: coefficients 1 and 1, γ = 1, normalised, whitened."""
    mask = _as_mask(mask, token_rewards.shape)
    _check_rows("outcomes", outcomes, mask.shape[0])
    _check_groups(mask.shape[0], group_size)
    process = torch.where(mask, _float(token_rewards), 0.0)
    if normalise:
        process = normalise_process_rewards(process, mask)
    process_returns = discounted_returns(leave_one_out(process, mask, group_size), process_gamma)
    last = last_token(mask)
    outcome = _float(outcomes)[:, None] * last
    outcome_returns = discounted_returns(leave_one_out(outcome, last, group_size), outcome_gamma)
    returns = process_coef * process_returns + outcome_coef * outcome_returns
    if whiten:
        return masked_whiten(returns, mask)
    return torch.where(mask, returns, 0.0)
