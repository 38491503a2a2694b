"""Tolerances of the numerical tests, derived from the error bound of what each test compares.

A test that compares two computations of the same quantity by different kernels, batch layouts,
orders of accumulation or dtypes cannot ask for more agreement than floating point guarantees, and
must not ask for less: a tolerance that only fits the numbers one machine gave fails on a machine
with another CPU instruction set (AVX-512 / AVX2, ``ATEN_CPU_CAPABILITY``) or thread count, where the
kernels sum in another order. The rule (docs/development.md, "Numerical tolerances"):

* A sum or dot product of ``n`` terms in a dtype with unit roundoff ``u`` is off by at most
  ``n·u·Σ|terms|`` (to first order; Higham, *Accuracy and Stability of Numerical Algorithms*, §3.1).
  A chain of such accumulations (a layer's projections, its attention over the keys, ...) adds the
  lengths. Two computations that each meet the bound differ by at most twice it: ``2·n·u``, times the
  magnitude of what is summed and the factor by which the quantity compared amplifies its inputs'
  errors (``amplification``).
* Computations that are the same kernel on the same inputs stay exact (``torch.equal``).

``u`` is 2^-24 ≈ 6.0e-8 for float32, 2^-8 for bfloat16, 2^-11 for float16, 2^-53 for float64.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from rredcot.method.assign import TraceCredit

UNIT_ROUNDOFF = {
    torch.float64: 2.0**-53,
    torch.float32: 2.0**-24,
    torch.float16: 2.0**-11,
    torch.bfloat16: 2.0**-8,
}


def tol(n_terms: int, amplification: float = 1.0, dtype: torch.dtype = torch.float32) -> float:
    """Largest difference of two ``dtype`` computations of an accumulation of ``n_terms`` terms:
    ``2·n·u·amplification`` (``amplification``: the magnitude of the terms times the condition of
    whatever maps the sums to the compared quantity)."""
    if n_terms < 0 or amplification < 0:
        raise ValueError("n_terms and amplification must be non-negative")
    return 2.0 * n_terms * UNIT_ROUNDOFF[dtype] * amplification


def float32_tol(n_terms: int, amplification: float = 1.0) -> float:
    """:func:`tol` in float32 (u = 2^-24)."""
    return tol(n_terms, amplification, torch.float32)


def decoder_terms(layers: int, seq_len: int, hidden: int, intermediate: int, vocab: int) -> int:
    """Accumulation length of one token's log-probability through a decoder-only transformer.

    Per layer: two RMSNorms, the q/k/v and output projections, the query-key products (head size
    at most ``hidden``) and the gate/up projections each sum over ``hidden`` (``5·hidden`` in all,
    the norms and projections in a row), the softmax's denominator and the attention-weighted
    values over at most ``seq_len`` keys (``2·seq_len``), the MLP's down projection over
    ``intermediate``. Then the final norm and the LM head over ``hidden`` and the log-softmax over
    ``vocab``. The network's own conditioning is taken as 1 (normalised layers, small random
    weights: the tiny models of these tests).
    """
    return layers * (5 * hidden + 2 * seq_len + intermediate) + 2 * hidden + vocab


def model_terms(model: torch.nn.Module, seq_len: int) -> int:
    """:func:`decoder_terms` of a Hugging Face causal LM's config."""
    c = model.config
    return decoder_terms(c.num_hidden_layers, seq_len, c.hidden_size, c.intermediate_size, c.vocab_size)


def log_prob_sum_tol(terms: int, n_scored: int, logit_scale: float = 1.0) -> dict[str, float]:
    """``atol``/``rtol`` for ``assert_close`` of two float32 sums of ``n_scored`` teacher-forced
    log-probabilities, each through an accumulation of ``terms`` terms (:func:`decoder_terms`).

    Each log-probability is off by at most ``terms·u·logit_scale`` (the logits of the tiny random
    models lie within ±1); the errors of ``n_scored`` of them add up (``atol``). The sums are
    accumulated in float64 and rounded to float32 once (``rtol``: ``2u``).
    """
    return {"atol": float32_tol(n_scored * terms, logit_scale), "rtol": float32_tol(1)}


def entropy_tol(
    terms: int, vocab: int, logit_scale: float = 1.0, dtype: torch.dtype = torch.float32
) -> float:
    """Tolerance of two computations of one token's predictive entropy in bits whose logits (within
    ``±logit_scale``) went through ``terms`` accumulations in ``dtype``.

    With every log-probability off by at most ``e = terms·u·logit_scale``, each ``p·log p`` moves by
    ``p·e·(|log p| + 1)``, so ``H`` moves by ``e·(H + 1/ln 2)`` bits, and ``H <= log2(vocab)``: the
    amplification is ``logit_scale·(log2(vocab) + 2)``.
    """
    return tol(terms, logit_scale * (math.log2(vocab) + 2.0), dtype)


def attention_tol(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float) -> float:
    """Tolerance of two float32 computations of scaled dot-product attention of these inputs.

    A score is a dot product over the head size d, off by ``d·u·S`` with ``S`` the largest
    ``scaling·Σ_i |q_i·k_i|``; the softmax weights then move relatively by twice that plus ``keys·u``
    (its denominator), and the weighted sum of values over the keys adds ``keys·u`` of
    ``max |v|``: ``u·(2·d·S + 2·keys)·max |v|``, within ``n = 2·d + 2·keys`` terms amplified by
    ``max(1, S)·max |v|``.
    """
    d, keys = query.shape[-1], key.shape[-2]
    s = float(scaling * (query.reshape(-1, d).abs() @ key.reshape(-1, d).abs().T).max())
    return float32_tol(2 * d + 2 * keys, max(1.0, s) * float(value.abs().max()))


def multiplier_tol(
    credit: TraceCredit, advantage: float, mix: float, log_value_error: float, value_space: str = "linear"
) -> torch.Tensor:
    """Per-token bound on how far σ·|o| of a trace's ``credit`` (uniform token shares within a
    segment) moves when every log value of the trace moves by at most ``log_value_error`` (first
    order; derived from ``rredcot.method.credit``).

    ``σ_t·|o| = (1 - mix) + mix·|o|·w_k/n_k`` on a token of segment k with ``n_k`` tokens, where
    ``w_k = g_k/G``, ``g_k = max(±r̂_k, 0)`` (the sign of the advantage) and ``G = Σ_j g_j``. Then

        |Δ σ_t·|o|| <= mix·(|o|/n_k)·(|Δg_k| + w_k·Σ_j |Δg_j|)/G,   |Δg_j| <= |Δr̂_j|.

    A normalised ratio of value differences: small total credit G and short segments amplify the
    errors. Linear values ``r̂_j = e_{j+1} - e_j`` with ``e_j = exp(log v_j - max log v)`` in (0, 1]:
    each ``e_j`` moves by at most ``2δ·e_j`` (``δ`` = ``log_value_error``; the max moves too), so
    ``|Δr̂_j| <= 2δ·(e_j + e_{j+1})``. Log values ``r̂_j = log v_{j+1} - log v_j``: ``|Δr̂_j| <= 2δ``.
    ``log_values`` holds the K+1 exit points' log values (an answer segment's reward, the last of
    ``segment_rewards``, adds one more value after them). Both sides round σ·|o| to float32 at the
    end: ``2·u·σ_t·|o|`` more.
    """
    multiplier, segment_starts = credit.multiplier, credit.segment_starts
    n = multiplier.numel()
    rewards = credit.segment_rewards.to(torch.float64)
    g = (rewards if advantage > 0 else -rewards).clamp_min(0.0)
    counts = torch.bincount(_segment_ids(segment_starts, n), minlength=rewards.numel()).to(torch.float64)
    g = torch.where(counts > 0, g, torch.zeros_like(g))
    rounding = float32_tol(1, 1.0) * multiplier.abs().to(torch.float64)
    if float(g.sum()) <= 0.0 or mix == 0.0 or advantage == 0.0:
        return rounding
    lv = credit.log_values.to(torch.float64).flatten()
    if value_space == "linear":
        e = (lv - lv.max()).exp()
        if rewards.numel() == lv.numel():  # the answer segment's value follows the last exit point
            e = torch.cat([e, torch.ones(1, dtype=torch.float64)])  # bounded by 1 (not read back)
        d_r = 2.0 * log_value_error * (e[:-1] + e[1:])[: rewards.numel()]
    else:
        d_r = torch.full_like(rewards, 2.0 * log_value_error)
    total = float(g.sum())
    w = g / total
    ids = _segment_ids(segment_starts, n)
    per_segment = mix * (n / counts.clamp_min(1.0)) * (d_r + w * float(d_r.sum())) / total
    return per_segment[ids] + rounding


def _segment_ids(starts: list[int], n_tokens: int) -> torch.Tensor:
    ids = torch.zeros(n_tokens, dtype=torch.long)
    for k, start in enumerate(starts[1:], start=1):
        ids[start:] = k
    return ids


def assert_same_credit(
    other: TraceCredit, reference: TraceCredit, advantage: float, mix: float, scores: dict
) -> torch.Tensor:
    """``other``'s credit of a trace is ``reference``'s, its exit points scored another way: the same
    segments and exit points, scores within ``scores`` (:func:`log_prob_sum_tol`), and σ·|o| within
    its condition number (:func:`multiplier_tol`) times how far the log values moved (the last
    one, after the answer segment, also by the answer's log ratio). Returns that bound per token."""
    assert other.segment_starts == reference.segment_starts and other.cuts == reference.cuts
    for got, want in (
        (other.log_p_solution, reference.log_p_solution),
        (other.log_p_answer, reference.log_p_answer),
    ):
        torch.testing.assert_close(got, want, **scores)
    moved = float((other.log_values - reference.log_values).abs().max())
    moved += abs((other.answer_reward or 0.0) - (reference.answer_reward or 0.0))
    bound = multiplier_tol(reference, advantage, mix, moved)
    assert ((other.multiplier - reference.multiplier).abs() <= bound).all(), (
        f"σ·|o| moved {float((other.multiplier - reference.multiplier).abs().max()):.3g}, "
        f"bound {float(bound.min()):.3g}..{float(bound.max()):.3g}"
    )
    return bound
