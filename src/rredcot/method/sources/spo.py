"""SPO-chain (Segment Policy Optimization, Guo et al., arXiv 2505.23564): segment advantages from
Monte Carlo values at boundaries cut where the policy is unsure, each segment's advantage given to its
tokens, registered as ``spo`` (docs/method.md, "SPO-chain").

The rule, as SPO's public code (AIFrameResearch/SPO) applies it for its chain variant:

- **Cutpoints.** One teacher-forced pass of the policy gives p_t = π(o_t | prompt, o_<t) for every
  completion token. Token t is a cutpoint when p_t < ``threshold`` (SPO: 0.9, fixed in its code).
- **Boundaries.** Every ``interval``-th cutpoint, from the first (SPO-chain's ``cutpoint_interval``,
  5 by default: the "int5" runs; its configs also try 1 to 100), is a segment boundary. The boundary
  at cutpoint t is the state ``prompt ⊕ o_<t``, just before the unsure token, so each segment starts
  with a cutpoint and holds ``interval`` of them (the last one up to that many).
- **Values.** K rollouts of the policy from each boundary (K = ``samples``: 9 in SPO-chain's
  GSM8K and MATH runs, 4 in some of its Qwen configs); V(boundary) is the mean of their rewards.
  The value after the trace's last token is its own outcome.
- **Segment advantages.** Segment k, the tokens from boundary c_k up to the next boundary (or the
  end), gets V(c_{k+1}) − V(c_k), the final one outcome − V(c_last). The tokens before the first
  boundary get 0: SPO estimates no value at the prompt unless the first token is itself a
  cutpoint. A trace without cutpoints gets 0 on every token.
- **Probability mask.** Every token of a segment carries its segment's advantage, but only the
  cutpoints carry a policy gradient: SPO zeroes the advantage of tokens with p_t ≥ 0.9 and masks
  them out of its loss (``use_prob_mask``, on in every SPO-chain run). The tokens before the first
  boundary hold no cutpoint, so their 0 loses nothing.
- **Whitening.** SPO's trainer whitens the advantages over the batch's cutpoint tokens (mean 0,
  unbiased variance 1) before its PPO loss (``whiten_advantages``).

Where our setting differs, minimally adapted (docs/method.md, "SPO-chain", says why):

- **GRPO groups.** The method gives each token its own advantage (the ``advantage`` form of
  ``rredcot.method.registry.CreditMethod``): the group's advantage A is not multiplied in, and a
  trace whose group all scored alike (A = 0) still gets SPO's advantages. Boundaries with the same
  prefix (a group's prompt, when its first token is a cutpoint) share their rollouts
  (``PolicyRollouts``).
- **Exit points.** SPO-chain knows no exit points: its boundaries fall wherever the policy is
  unsure, the answer after the model's own exit included, and are not RREDCoT's. The outcome
  reward, in [0, 1] here, is both a rollout's reward and the final value, as SPO's 0/1 reward is.
- **Few cutpoints.** ``min_boundaries`` (default 1: SPO as published) shrinks the interval for a
  trace whose cutpoints are too few to give that many boundaries; SPO has no such floor.
- **EOS** is never a cutpoint (SPO's responses carry none); it keeps its segment's advantage and
  its own probability mask.
- **Loss.** The trainer puts the (whitened, masked) token advantages into TRL's loss under the arm's
  normaliser; the masked tokens count in its denominator, where SPO's loss averages over the
  cutpoint tokens alone. Whitening runs over the traces of one credit batch (a process's share of
  the step's batch); SPO's gathers its statistics over every process.
- **Temperature.** p_t is the model's probability at temperature 1, the testbed's sampling
  temperature (SPO divides the logits by its sampling temperature).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from rredcot.method import credit as C
from rredcot.method.forward import LogitHead, causal_states, model_device, pad_right, to_host
from rredcot.method.registry import (
    Batch,
    CreditMethod,
    SegmentRewards,
    register_credit_method,
    register_reward_source,
)
from rredcot.method.scoring.batching import length_chunks, spans
from rredcot.method.scoring.types import ScoringBudget


def completion_probabilities(
    model: torch.nn.Module,
    traces: Sequence[tuple[Sequence[int], Sequence[int]]],
    budget: ScoringBudget | None = None,
) -> list[Tensor]:
    """p(o_t | prompt, o_<t) of every completion token of each (prompt_ids, completion_ids) under the
    model (float32, on the host): one teacher-forced pass per chunk of traces, within ``budget``. A
    first token that no position predicts (an empty prompt) gets 1.0: never a cutpoint."""
    budget = budget or ScoringBudget()
    device = model_device(model)
    seqs = [[*prompt, *completion] for prompt, completion in traces]
    out = [torch.ones(len(completion), dtype=torch.float32) for _, completion in traces]
    parts: list[tuple[list[int], list[int], Tensor]] = []
    with torch.inference_mode():
        head = LogitHead(model, budget.max_logit_elements)
        for rows in length_chunks([len(s) for s in seqs], budget.max_batch_tokens):
            rows = [i for i in rows if seqs[i]]
            if not rows:
                continue
            ids = pad_right([seqs[i] for i in rows]).to(device, non_blocking=True)
            hidden = causal_states(model, ids)
            first = [max(len(traces[i][0]), 1) for i in rows]  # sequence index of the first predicted token
            counts = [len(seqs[i]) - f for i, f in zip(rows, first, strict=True)]
            at = spans([b * ids.shape[1] + f - 1 for b, f in enumerate(first)], counts).to(device)
            log_p = head.token_log_probs(hidden.flatten(0, 1)[at], ids.flatten()[at + 1])
            parts.append((rows, counts, log_p))
    moved = to_host(*(log_p for _, _, log_p in parts))
    for (rows, counts, _), log_p in zip(parts, moved, strict=True):
        for i, piece in zip(rows, log_p.split(counts), strict=True):
            out[i][len(out[i]) - piece.numel() :] = piece.exp()
    return out


def cutpoints(probs: Tensor, threshold: float, scored: int | None = None) -> list[int]:
    """The tokens the policy was unsure of: indices t < ``scored`` (default: all) with p_t < threshold."""
    p = torch.as_tensor(probs)[: len(probs) if scored is None else scored]
    return torch.nonzero(p < threshold).flatten().tolist()


def boundaries(points: Sequence[int], interval: int, min_boundaries: int = 1) -> list[int]:
    """Every ``interval``-th cutpoint from the first: the prefix lengths where a segment starts. Where
    that gives fewer than ``min_boundaries``, the largest interval that gives as many (at least 1)."""
    if interval < 1 or min_boundaries < 1:
        raise ValueError("interval and min_boundaries must be positive")
    step = interval
    if math.ceil(len(points) / interval) < min_boundaries:
        step = max(1, len(points) // min_boundaries)
    return list(points[::step])


def chain_advantages(
    values: Sequence[float], outcome: float, cuts: Sequence[int], n_tokens: int
) -> tuple[list[int], Tensor]:
    """SPO-chain's segments and their advantages (float64): the segment from cut c_k to the next (or
    to the end) gets V(c_{k+1}) − V(c_k), the last one ``outcome`` − V(c_last); the tokens before the
    first cut, if any, are one segment with advantage 0 (no value at the prompt). Without cuts the
    trace is one segment with advantage 0. Returns (segment starts, advantages)."""
    if len(values) != len(cuts):
        raise ValueError(f"{len(values)} values for {len(cuts)} boundaries")
    if any(b <= a for a, b in zip(cuts, cuts[1:], strict=False)) or (
        cuts and not 0 <= cuts[0] <= cuts[-1] < n_tokens
    ):
        raise ValueError(f"boundaries must increase strictly inside the {n_tokens} tokens, got {list(cuts)}")
    if not cuts:
        return ([0] if n_tokens else []), torch.zeros(1 if n_tokens else 0, dtype=torch.float64)
    ends = [*values[1:], outcome]
    gains = [float(end) - float(start) for start, end in zip(values, ends, strict=True)]
    if cuts[0] > 0:
        return [0, *cuts], torch.tensor([0.0, *gains], dtype=torch.float64)
    return list(cuts), torch.tensor(gains, dtype=torch.float64)


def spread(starts: Sequence[int], advantages: Tensor, n_tokens: int) -> Tensor:
    """Each token's segment advantage (float64, length ``n_tokens``)."""
    if n_tokens == 0:
        return torch.zeros(0, dtype=torch.float64)
    lengths = [b - a for a, b in zip(starts, [*starts[1:], n_tokens], strict=True)]
    return torch.repeat_interleave(advantages.double(), torch.tensor(lengths))


def whiten(advantages: list[Tensor], masks: list[Tensor]) -> list[Tensor]:
    """The advantages of several traces whitened together over their masked tokens: minus the mean,
    over sqrt(unbiased variance + ``credit.WHITEN_EPS``), as SPO's trainer does (with no masked token,
    over every token). Fewer than two tokens to measure: returned as they are."""
    pool = torch.cat(advantages) if advantages else torch.zeros(0, dtype=torch.float64)
    chosen = torch.cat(masks) if masks else torch.zeros(0, dtype=torch.bool)
    sample = pool[chosen] if bool(chosen.any()) else pool
    if sample.numel() < 2:
        return advantages
    mean, scale = C.whitening(sample)
    return [(a - mean) * scale for a in advantages]


def _values(sums: Sequence[float], samples: int) -> list[float]:
    """V at each boundary: the mean reward of its ``samples`` rollouts."""
    if any(not 0.0 <= s <= samples + 1e-9 for s in sums):
        raise ValueError(f"rollout reward sums must lie in [0, {samples}], got {list(sums)}")
    return [min(float(s) / samples, 1.0) for s in sums]


@register_reward_source("spo_chain", reads=("spo",), needs=("rollouts", "outcome"), segments=False)
def spo_chain(assigner, batch: Batch) -> list[SegmentRewards]:  # noqa: ANN001
    """SPO-chain's segment advantages (arXiv 2505.23564): boundaries at every ``spo.interval``-th
    token the policy gives probability below ``spo.threshold``, values from ``spo.samples`` rollouts
    each (``assign(rollouts=...)``), the change of value over each segment on its tokens.

    ``rewards`` are the segment advantages V(end) − V(start) (the final value the trace's outcome),
    ``cuts`` the boundaries and ``log_values`` log V there; ``advantages`` are the token advantages
    the trainer applies: the segment's, on the cutpoints only, whitened over the batch."""
    cfg = assigner.cfg
    spo = cfg.spo
    if batch.rollouts is None:
        raise ValueError(f"credit method {cfg.method!r} needs rollouts= (policy rollouts and rewards)")
    with assigner.timed("probabilities"):
        pairs = [(t.prompt_ids, t.completion_ids) for t in batch.items]
        probs = completion_probabilities(batch.policy, pairs, cfg.budget)
    eos = assigner.tok.eos_token_id
    cuts, masks = [], []
    for item, p in zip(batch.items, probs, strict=True):
        ids = item.completion_ids
        scored = len(ids) - 1 if ids and ids[-1] == eos else len(ids)  # EOS is never a cutpoint
        cuts.append(boundaries(cutpoints(p, spo.threshold, scored), spo.interval, spo.min_boundaries))
        masks.append(p < spo.threshold)  # the tokens that carry a gradient
    sums: list[list[float]] = [[] for _ in batch.items]
    if any(cuts):
        with assigner.timed("rollouts"):
            sums = batch.rollouts(batch.policy, batch.items, cuts)
    if len(sums) != len(batch.items) or any(len(s) != len(c) for s, c in zip(sums, cuts, strict=True)):
        raise ValueError("rollouts must return one outcome sum per boundary of every trace")
    starts, rewards, values, raw = [], [], [], []
    for item, trace_cuts, trace_sums in zip(batch.items, cuts, sums, strict=True):
        if item.outcome is None or not 0.0 <= item.outcome <= 1.0:
            raise ValueError(f"SPO-chain credit needs each trace's outcome in [0, 1], got {item.outcome}")
        n = len(item.completion_ids)
        v = _values(trace_sums, spo.samples)
        s, r = chain_advantages(v, float(item.outcome), trace_cuts, n)
        starts.append(s)
        rewards.append(r)
        values.append(torch.tensor(v, dtype=torch.float64))
        raw.append(spread(s, r, n))
    paid = whiten(raw, masks) if spo.whiten else raw
    out = []
    for j in range(len(batch.items)):
        advantages = torch.where(masks[j], paid[j], 0.0).float()  # SPO's probability mask
        out.append(
            SegmentRewards(
                rewards[j],
                starts[j],
                cuts=cuts[j],
                log_values=values[j].log(),
                advantages=advantages,
            )
        )
    return out


register_credit_method(
    CreditMethod(
        "spo",
        "spo_chain",
        None,
        "SPO-chain (arXiv 2505.23564): segments cut at every fifth token the policy gives probability "
        "below 0.9, Monte Carlo values from 9 rollouts at each boundary, and each segment's change of "
        "value as the advantage of its unsure tokens, in place of the group's advantage.",
        form="advantage",
    )
)
