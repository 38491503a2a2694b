"""Pure-torch core of RREDCoT credit assignment (docs/method.md): values, segment rewards and
the token coefficient σ (the credit methods that combine them: ``rredcot.method.registry``).

The pipeline for one trace is::

    token texts + token entropies --piece_starts / merge_pieces--> segments
    segments --exit_cuts--> exit points --(teacher forcing, scoring/)--> log p(u|s), log p(y|u,s)
    --pr_log_value--> log v̂ per exit point --segment_rewards--> r̂_k --token_multiplier--> σ·|o|

Exit-point convention
---------------------
For K segments with start indices ``b_0 = 0 < b_1 < … < b_{K-1}`` in a completion of length L the
K+1 exit points are the cut positions ``[b_0, b_1, …, b_{K-1}, L]`` (``exit_cuts``): exit 0 lies right
after the prompt (before any thinking), the last one after the whole completion. The model "exits"
at cut c by reading ``completion[:c]`` followed by the exit string. Segment k spans tokens
``[cut_k, cut_{k+1})`` and earns the change of value across it (``value_rewards``):
``r̂_k = (v̂(cut_{k+1}) - v̂(cut_k)) / max_j v̂(cut_j)`` (``linear``, the default) or
``r̂_k = log v̂(cut_{k+1}) - log v̂(cut_k)`` (``log``).

Values are carried in log space: the probability of a whole reference solution is far below float
range. Nothing here needs gradients; every public function runs under ``torch.no_grad``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

# Log values are clamped here before differencing, so that an exit point whose value is exactly 0
# (every utility 0, or a probability that underflowed) yields a large but finite reward instead of
# ±inf or NaN (-inf - -inf). Two such exit points in a row then differ by exactly 0.
LOG_VALUE_FLOOR: float = -1.0e4

# Added to the variance before token advantages are whitened (``whitening``): the value of the PPO-style
# trainers of SPO and PRIME.
WHITEN_EPS: float = 1e-8

# A trace whose total signed credit Σ g_k (in its rewards' units) is at most this has nothing to
# redistribute.
MIN_TOTAL_CREDIT: float = 1.0e-8


# --------------------------------------------------------------------------------------------------
# Values and segment rewards (section 2.2)
# --------------------------------------------------------------------------------------------------


@torch.no_grad()
def pr_log_value(
    log_p_solution: Tensor | float,
    log_p_answer: Tensor | float,
    log_q: Tensor | float,
    utility: Tensor | float,
) -> Tensor:
    """log v̂ of the PR-style importance-sampling estimate over the last dimension (N pairs).

    ``log v̂ = logsumexp_i(log p(u_i|s) + log p(y_i|u_i,s) - log q_i + log ζ_i) - log N``. Inputs
    broadcast against each other (e.g. [exit points, N] with [N]). Pairs with utility 0 contribute
    nothing (log 0 = -inf drops out of the logsumexp); the result is -inf when every utility is 0.
    Computed and returned in float64, since log-probabilities of whole solutions reach the hundreds.
    """
    tensors = [
        torch.as_tensor(x, dtype=torch.float64) for x in (log_p_solution, log_p_answer, log_q, utility)
    ]
    lps, lpa, lq, zeta = torch.broadcast_tensors(*tensors)
    if lps.dim() == 0 or lps.shape[-1] == 0:
        raise ValueError("the last dimension must index the N >= 1 reference pairs")
    if (zeta < 0).any() or zeta.isnan().any():
        raise ValueError("utilities must be non-negative")
    log_zeta = torch.where(zeta > 0, zeta.log(), torch.full_like(zeta, -math.inf))
    # A zero-utility pair may carry log p = -inf too; mask it so that no inf - inf can appear.
    terms = torch.where(zeta > 0, lps + lpa - lq + log_zeta, torch.full_like(zeta, -math.inf))
    return torch.logsumexp(terms, dim=-1) - math.log(terms.shape[-1])


@torch.no_grad()
def segment_rewards(log_values: Tensor) -> Tensor:
    """Segment rewards ``r̂_k = log v̂(exit k+1) - log v̂(exit k)`` from K+1 log values (last dim).

    Log values are clamped at ``LOG_VALUE_FLOOR`` first: a value of exactly 0 (log -inf) then gives a
    large finite reward rather than ±inf, and two consecutive zero values give exactly 0, not NaN.
    """
    log_values = torch.as_tensor(log_values)
    if log_values.isnan().any():
        raise ValueError("log values contain NaN")
    if log_values.dim() == 0 or log_values.shape[-1] < 1:
        raise ValueError("need at least one exit point along the last dimension")
    return torch.diff(log_values.clamp_min(LOG_VALUE_FLOOR), dim=-1)


VALUE_SPACES = ("linear", "log")


@torch.no_grad()
def value_rewards(log_values: Tensor, space: str, answer_log_ratio: float | None = None) -> Tensor:
    """Segment rewards from K+1 exit-point log values, plus the answer segment's when
    ``answer_log_ratio`` (log of the value after the model's own final solution over the value at
    its exit) is given: K or K+1 rewards (float64).

    ``linear``: ``r̂_k = (v̂_{k+1} - v̂_k) / max_j v̂_j``, the change of expected utility that the
    redistribution theory gives each segment, scaled by the trace's largest value so that it stays
    in float range and in [-1, 1] (σ normalises each trace's rewards, so the scale cancels). A wrong
    trace's blame then goes where most of its value was lost: once a prefix has lost nearly all of
    it, later drops, however many nats, move little.
    ``log``: ``r̂_k = log v̂_{k+1} - log v̂_k`` (``segment_rewards``), the answer's log ratio as it
    is; every halving of the value weighs the same wherever it happens, so an estimate that keeps
    falling after the step that went wrong (a reference solution scored against a trace that
    copies every later wrong value) spreads the blame past that step
    (docs/method.md, "Value differences").
    """
    if space not in VALUE_SPACES:
        raise ValueError(f"value space must be one of {VALUE_SPACES}, got {space!r}")
    log_values = torch.as_tensor(log_values, dtype=torch.float64)
    if space == "log":
        rewards = segment_rewards(log_values)
        if answer_log_ratio is None:
            return rewards
        return torch.cat([rewards, rewards.new_tensor([answer_log_ratio])])
    if log_values.isnan().any() or (answer_log_ratio is not None and math.isnan(answer_log_ratio)):
        raise ValueError("log values contain NaN")
    if log_values.dim() != 1 or log_values.numel() < 1:
        raise ValueError("need the log values of one trace's exit points (one dimension, at least one)")
    if answer_log_ratio is not None:
        log_values = torch.cat([log_values, log_values[-1:] + answer_log_ratio])
    log_values = log_values.clamp_min(LOG_VALUE_FLOOR)
    return torch.diff((log_values - log_values.max()).exp())


# --------------------------------------------------------------------------------------------------
# Token coefficient σ (section 2.4)
# --------------------------------------------------------------------------------------------------


@torch.no_grad()
def token_multiplier(
    segment_ids: Tensor,
    segment_rewards: Tensor,
    advantage: float | Tensor,
    mix: float,
    token_weights: Tensor | None = None,
) -> Tensor:
    """Per-token factor ``σ·|o|`` (σ_t times the trace length |o|) for one trace (float32; 0 on
    padding, where segment id is -1).

    A trainer multiplies the trace's advantage by it. Segment weights follow the sign of the
    outcome: ``g_k = max(r̂_k, 0)`` for a positive advantage, ``max(-r̂_k, 0)`` for a negative one,
    ``w_k = g_k / Σ g``. Segments without tokens in ``segment_ids`` get no weight (their credit could
    not be paid out). ``w_k`` is spread over segment k uniformly or in proportion to the
    non-negative ``token_weights`` (uniformly within a segment whose weights sum to 0), then mixed
    with uniform credit: ``σ_t = (1 - mix)/|o| + mix · w_k · share_t``.

    When there is nothing to redistribute (advantage 0, mix 0, or ``Σ g <= MIN_TOTAL_CREDIT``) the
    result is exactly 1.0 on every token, so uniform credit reproduces GRPO bit for bit.
    """
    ids = torch.as_tensor(segment_ids)
    rewards = torch.as_tensor(segment_rewards, dtype=torch.float64, device=ids.device).flatten()
    adv = float(advantage)
    if ids.dim() != 1:
        raise ValueError("segment_ids must be one-dimensional (one trace)")
    if not 0.0 <= mix <= 1.0:
        raise ValueError(f"mix must lie in [0, 1], got {mix}")
    if math.isnan(adv) or not torch.isfinite(rewards).all():
        raise ValueError("advantage and segment rewards must be finite")
    mask = ids >= 0
    if (ids >= rewards.numel()).any():
        raise ValueError(f"segment ids exceed the {rewards.numel()} segment rewards")

    out = mask.to(torch.float32)  # exactly 1.0 on tokens: the uniform / GRPO case
    n_tokens = int(mask.sum())
    if n_tokens == 0 or adv == 0.0 or mix == 0.0:
        return out

    seg = ids[mask]
    counts = torch.bincount(seg, minlength=rewards.numel()).to(torch.float64)
    gain = (rewards if adv > 0 else -rewards).clamp_min(0.0)
    gain = torch.where(counts > 0, gain, torch.zeros_like(gain))
    # Normalise by the largest gain first so that huge rewards cannot overflow the sum.
    top = float(gain.max())
    if float(gain.sum()) <= MIN_TOTAL_CREDIT or top == 0.0:
        return out
    scaled = gain / top
    seg_weight = scaled / scaled.sum()

    # Share of each token within its segment: uniform, or proportional to its token weight.
    share = 1.0 / counts[seg]
    if token_weights is not None:
        tw = torch.as_tensor(token_weights, dtype=torch.float64, device=ids.device)
        if tw.shape != ids.shape or not torch.isfinite(tw).all():
            raise ValueError("token_weights must be finite and shaped like segment_ids")
        # Clamp tiny negative round-off (entropies computed as -Σ p log p can dip below 0).
        tw = tw[mask].clamp_min(0.0)
        tw_sum = torch.zeros_like(counts).index_add_(0, seg, tw)
        seg_sum = tw_sum[seg]
        share = torch.where(seg_sum > 0, tw / torch.where(seg_sum > 0, seg_sum, 1.0), share)

    sigma = (1.0 - mix) / n_tokens + mix * seg_weight[seg] * share
    out[mask] = (sigma * n_tokens).to(torch.float32)
    return out


@torch.no_grad()
def whitening(sample: Tensor) -> tuple[Tensor, Tensor]:
    """Mean and scale ``1 / sqrt(var + WHITEN_EPS)`` (unbiased variance) of ``sample``, for whitening
    token advantages as PPO-style trainers do (``(a − mean) · scale``); at least two entries."""
    if sample.numel() < 2:
        raise ValueError(f"whitening needs at least two values, got {sample.numel()}")
    return sample.mean(), torch.rsqrt(sample.var(unbiased=True) + WHITEN_EPS)


# --------------------------------------------------------------------------------------------------
# Token entropies (section 3b)
# --------------------------------------------------------------------------------------------------


@torch.no_grad()
def token_entropies(logits: Tensor) -> Tensor:
    """Predictive entropy in bits over the last (vocab) dimension, computed in float32.

    Uses log_softmax for stability; entries with probability 0 (e.g. logits of -inf) contribute 0
    instead of 0 · -inf = NaN.
    """
    log_p = torch.log_softmax(logits.float(), dim=-1)
    p = log_p.exp()
    plogp = torch.where(p > 0, p * log_p, torch.zeros_like(p))
    return (-plogp.sum(dim=-1) / math.log(2.0)).clamp_min(0.0)


# --------------------------------------------------------------------------------------------------
# Segment rewards of the reference arms: perfect blame and Monte Carlo values
# --------------------------------------------------------------------------------------------------


@torch.no_grad()
def oracle_segment_rewards(n_segments: int, culprit_segment: int | None) -> Tensor:
    """Segment rewards of perfect blame: ``-1`` for the segment where the trace first goes wrong, 0
    elsewhere (float64). Fed to :func:`token_multiplier`, a negative advantage then puts the whole
    redistributed share (``mix``) on that segment, and a positive advantage (or no culprit) gives
    uniform credit, since no segment gained value.

    These are the segment rewards of a value that is 1 while a prefix is still on a right path and
    drops at the culprit (in units of that drop): the limit an exit-point value estimate tends to
    when it is exact and the policy follows its prefix.
    """
    if n_segments < 1:
        raise ValueError("need at least one segment")
    rewards = torch.zeros(n_segments, dtype=torch.float64)
    if culprit_segment is not None:
        if not 0 <= culprit_segment < n_segments:
            raise ValueError(f"culprit segment {culprit_segment} outside 0..{n_segments - 1}")
        rewards[culprit_segment] = -1.0
    return rewards


@torch.no_grad()
def mc_log_values(outcome_sums: Tensor | list[float], samples: int) -> Tensor:
    """log v̂ at each exit point from the summed outcomes (rewards in [0, 1]) of ``samples`` rollouts
    each: ``log((Σ r + 1) / (M + 2))`` (float64).

    **[decision]** The plain mean ``Σ r / M`` is 0 wherever no rollout succeeds, and a log value of
    -inf turns every drop to 0 into the whole trace's blame, however few rollouts saw it. The
    posterior mean under a uniform prior (Laplace's rule) keeps every value inside (0, 1), so a
    segment's reward (``value_rewards``, in either space) is finite and grows with the evidence
    behind it. A trace's known outcome enters as the same estimate with every rollout equal to it.
    """
    if samples < 1:
        raise ValueError("need at least one rollout per exit point")
    sums = torch.as_tensor(outcome_sums, dtype=torch.float64).flatten()
    if sums.isnan().any() or (sums < 0).any() or (sums > samples).any():
        raise ValueError(f"outcome sums must lie in [0, {samples}] (rewards in [0, 1])")
    return ((sums + 1.0) / (samples + 2.0)).log()


@torch.no_grad()
def entropy_multiplier(entropies: Tensor, mix: float) -> Tensor:
    """``σ·|o|`` of entropy weighting: ``σ_t = (1 - mix)/|o| + mix · H_t / Σ_s H_s`` (float32).

    **[decision]** The method multiplies the step advantage per token by "a normalised function of the
    entropy" without fixing it; normalising by the trace's total entropy keeps Σσ = 1, so the method
    stays return-equivalent and comparable with the others. The weighting ignores the advantage's sign:
    uncertain tokens carry the outcome either way. All-zero entropies give exactly uniform credit.
    """
    h = torch.as_tensor(entropies, dtype=torch.float64).flatten()
    if not 0.0 <= mix <= 1.0:
        raise ValueError(f"mix must lie in [0, 1], got {mix}")
    if not torch.isfinite(h).all():
        raise ValueError("entropies must be finite")
    h = h.clamp_min(0.0)
    n = h.numel()
    total = float(h.sum())
    if n == 0 or mix == 0.0 or total <= 0.0:
        return torch.ones(n, dtype=torch.float32)
    sigma = (1.0 - mix) / n + mix * h / total
    return (sigma * n).to(torch.float32)


@torch.no_grad()
def exit_log_values(
    log_p_solution: Tensor,
    log_p_answer: Tensor,
    log_q: Tensor | None = None,
    utility: Tensor | None = None,
) -> Tensor:
    """log v̂ at each exit point from scores of shape [n_exits, N] (float64, shape [n_exits]).

    ``log_q`` (shape [N]) defaults to the uniform proposal ``q_i = 1/N``; ``utility`` (shape [N])
    defaults to 1 for every pair (reference pairs are correct by construction).
    """
    lps = torch.as_tensor(log_p_solution, dtype=torch.float64)
    if lps.dim() != 2 or lps.shape[1] < 1:
        raise ValueError("scores must have shape [n_exits, N >= 1]")
    n = lps.shape[1]
    if log_q is None:
        log_q = torch.full((n,), -math.log(n), dtype=torch.float64)
    if utility is None:
        utility = torch.ones(n, dtype=torch.float64)
    return pr_log_value(lps, log_p_answer, log_q, utility)
