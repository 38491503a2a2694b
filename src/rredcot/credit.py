"""Pure-torch core of RREDCoT credit assignment (METHOD.md sections 2 and 3).

The pipeline for one trace is::

    token texts + token entropies --piece_starts / merge_pieces--> segments
    segments --exit_cuts--> exit points --(teacher forcing, exit_scoring.py)--> log p(u|s), log p(y|u,s)
    --pr_log_value--> log v̂ per exit point --segment_rewards--> r̂_k --token_multiplier--> σ_t · |o|

Exit-point convention
---------------------
For K segments with start indices ``b_0 = 0 < b_1 < … < b_{K-1}`` in a completion of length L the
K+1 exit points are the cut positions ``[b_0, b_1, …, b_{K-1}, L]`` (``exit_cuts``): exit 0 lies right
after the prompt (before any thinking), the last one after the whole completion. The model "exits"
at cut c by reading ``completion[:c]`` followed by the exit string. Segment k spans tokens
``[cut_k, cut_{k+1})`` and earns ``r̂_k = log v̂(cut_{k+1}) - log v̂(cut_k)``.

Values are handled in log space throughout: the probability of a whole reference solution is far
below float range, but differences of log values are well behaved. Nothing here needs gradients;
every public function runs under ``torch.no_grad``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

DEFAULT_KEYWORDS: tuple[str, ...] = (
    "Wait",
    "But",
    "Alternatively",
    "Hmm",
    "So",
    "Let me",
    "Now",
    "Therefore",
    "Thus",
    "Okay",
    "First",
    "Next",
    "Finally",
    "Check",
)

# Log values are clamped here before differencing, so that an exit point whose value is exactly 0
# (every utility 0, or a probability that underflowed) yields a large but finite reward instead of
# ±inf or NaN (-inf - -inf). Two such exit points in a row then differ by exactly 0.
LOG_VALUE_FLOOR: float = -1.0e4

# A trace whose total signed credit Σ g_k (in nats) is at most this has nothing to redistribute.
MIN_TOTAL_CREDIT: float = 1.0e-8


# --------------------------------------------------------------------------------------------------
# Segmentation (section 3)
# --------------------------------------------------------------------------------------------------


def merge_pieces(piece_entropies: Sequence[float] | Tensor, n_segments: int) -> list[list[int]]:
    """Greedily merge adjacent pieces until ``n_segments`` groups remain.

    Each step merges the adjacent pair of groups whose summed entropy is lowest (ties go to the
    leftmost pair), so predictable low-entropy text is lumped together and the exit-point budget is
    spent where the model was uncertain. Returns groups of consecutive piece indices, in order,
    covering every piece; with no more pieces than ``n_segments`` every piece is its own group.
    """
    if n_segments < 1:
        raise ValueError(f"n_segments must be >= 1, got {n_segments}")
    if isinstance(piece_entropies, Tensor):
        piece_entropies = piece_entropies.detach().double().cpu().tolist()
    groups = [[i] for i in range(len(piece_entropies))]
    sums = [float(h) for h in piece_entropies]
    while len(groups) > n_segments:
        # Strict '<' keeps the leftmost pair on ties.
        best = 0
        best_sum = sums[0] + sums[1]
        for i in range(1, len(groups) - 1):
            pair_sum = sums[i] + sums[i + 1]
            if pair_sum < best_sum:
                best, best_sum = i, pair_sum
        groups[best : best + 2] = [groups[best] + groups[best + 1]]
        sums[best : best + 2] = [best_sum]
    return groups


def _sentence_start_before(prefix: str) -> bool:
    """True when text ``prefix`` ends where a new sentence may begin (see ``piece_starts``)."""
    stripped = prefix.rstrip(" \t")
    if not stripped or stripped.endswith(("\n", "\r")):
        return True
    # Terminal punctuation must be followed by whitespace: "3.5" or "e.g.So" are no sentence start.
    return stripped.endswith((".", "?", "!")) and len(stripped) < len(prefix)


def _keyword_at(text: str, pos: int, keywords: Sequence[str]) -> bool:
    """True when a keyword starts at ``text[pos]`` as a whole word ("So" must not match "Some")."""
    for keyword in keywords:
        if text.startswith(keyword, pos):
            end = pos + len(keyword)
            if end == len(text) or not (text[end].isalnum() or text[end] == "_"):
                return True
    return False


def piece_starts(
    token_texts: Sequence[str], keywords: Sequence[str] = DEFAULT_KEYWORDS, split_on_newline: bool = True
) -> list[int]:
    """Start token indices of the pieces of a trace, split at generic delimiters (section 3a).

    A piece starts at token 0, at the token after any token whose text contains a newline (when
    ``split_on_newline``), and at a token that begins a sentence-initial discourse keyword: after
    stripping the token's leading whitespace its text starts the keyword (which may run on over
    several tokens, e.g. "Let" + " me"), the keyword is a whole word, and the text before it is empty
    or ends with a newline or with ". ", "? ", "! ". Keywords that begin inside a token are ignored,
    since pieces can only be cut at token boundaries. Matching is case-sensitive.
    """
    n_tokens = len(token_texts)
    if n_tokens == 0:
        return []
    text = "".join(token_texts)
    starts = {0}
    offset = 0
    for i, token in enumerate(token_texts):
        if split_on_newline and "\n" in token and i + 1 < n_tokens:
            starts.add(i + 1)
        lead = len(token) - len(token.lstrip())
        # A whitespace-only token cannot begin a keyword; the keyword's own token will.
        if lead < len(token):
            pos = offset + lead
            if _sentence_start_before(text[:pos]) and _keyword_at(text, pos, keywords):
                starts.add(i)
        offset += len(token)
    return sorted(starts)


def segment_starts(piece_starts: Sequence[int], groups: Sequence[Sequence[int]]) -> list[int]:
    """Start token index of each merged segment: the start of its first piece."""
    _check_groups(groups, len(piece_starts))
    return [int(piece_starts[group[0]]) for group in groups]


def segment_ids_from_starts(starts: Sequence[int], n_tokens: int) -> torch.LongTensor:
    """Per-token segment id (0..K-1) for segments beginning at ``starts`` in a trace of ``n_tokens``."""
    _check_starts(starts, n_tokens)
    ids = torch.zeros(n_tokens, dtype=torch.long)
    for k, start in enumerate(starts[1:], start=1):
        ids[start:] = k
    return ids  # type: ignore[return-value]


def segment_ids_from_groups(
    piece_starts: Sequence[int], groups: Sequence[Sequence[int]], n_tokens: int
) -> torch.LongTensor:
    """Per-token segment id from piece start indices and merged piece groups (``merge_pieces``)."""
    return segment_ids_from_starts(segment_starts(piece_starts, groups), n_tokens)


def exit_cuts(segment_starts: Sequence[int], n_tokens: int) -> list[int]:
    """The K+1 exit points ``[b_0, …, b_{K-1}, L]`` for K segments (see the module docstring)."""
    _check_starts(segment_starts, n_tokens)
    return [int(s) for s in segment_starts] + [n_tokens]


def segment_trace(
    token_texts: Sequence[str],
    token_entropies: Sequence[float] | Tensor,
    n_segments: int,
    keywords: Sequence[str] = DEFAULT_KEYWORDS,
) -> list[int]:
    """Hybrid keyword-entropy segmentation: segment start indices (the first is 0) of one trace.

    Pieces from ``piece_starts`` are scored by the sum of their tokens' entropies and merged by
    ``merge_pieces`` down to ``n_segments``.
    """
    if len(token_texts) != len(token_entropies):
        raise ValueError(f"{len(token_texts)} token texts but {len(token_entropies)} entropies")
    starts = piece_starts(token_texts, keywords)
    if not starts:
        return []
    entropies = torch.as_tensor(token_entropies, dtype=torch.float64).flatten()
    bounds = starts + [len(token_texts)]
    piece_h = [float(entropies[a:b].sum()) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    return segment_starts(starts, merge_pieces(piece_h, n_segments))


def _check_starts(starts: Sequence[int], n_tokens: int) -> None:
    if n_tokens == 0:
        if len(starts) != 0:
            raise ValueError("an empty trace has no segments")
        return
    if len(starts) == 0 or starts[0] != 0:
        raise ValueError(f"segment starts must begin with 0, got {list(starts)}")
    if any(b <= a for a, b in zip(starts[:-1], starts[1:], strict=True)) or starts[-1] >= n_tokens:
        raise ValueError(f"segment starts must increase strictly and stay below {n_tokens}: {list(starts)}")


def _check_groups(groups: Sequence[Sequence[int]], n_pieces: int) -> None:
    flat = [i for group in groups for i in group]
    if flat != list(range(n_pieces)) or any(len(group) == 0 for group in groups):
        raise ValueError("groups must be non-empty runs of consecutive piece indices covering every piece")


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
def pr_value(
    log_p_solution: Tensor | float,
    log_p_answer: Tensor | float,
    log_q: Tensor | float,
    utility: Tensor | float,
) -> Tensor:
    """The PR-style estimate v̂ as a probability (float64); see ``pr_log_value``."""
    return pr_log_value(log_p_solution, log_p_answer, log_q, utility).exp()


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


# --------------------------------------------------------------------------------------------------
# Token coefficient σ (section 2.4)
# --------------------------------------------------------------------------------------------------


@torch.no_grad()
def token_multiplier(
    segment_ids: Tensor,
    segment_rewards: Tensor,
    advantage: float | Tensor,
    mix: float = 0.5,
    token_weights: Tensor | None = None,
) -> Tensor:
    """Per-token factor ``σ_t · |o|`` for one trace (float32; 0 on padding, where segment id is -1).

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
def token_sigma(
    segment_ids: Tensor,
    segment_rewards: Tensor,
    advantage: float | Tensor,
    mix: float = 0.5,
    token_weights: Tensor | None = None,
) -> Tensor:
    """Token coefficient σ of one trace: ``token_multiplier(...) / |o|``.

    Non-negative, finite, sums to 1 over the non-padding tokens (0 on padding), and exactly
    ``1/|o|`` when there is nothing to redistribute.
    """
    multiplier = token_multiplier(segment_ids, segment_rewards, advantage, mix, token_weights)
    n_tokens = int((torch.as_tensor(segment_ids) >= 0).sum())
    return multiplier / max(n_tokens, 1)


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
