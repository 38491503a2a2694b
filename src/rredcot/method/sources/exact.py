"""Exact values (synthetic task only): the task computes, at each of RREDCoT's exit points, the
probability that the trace ends right for a policy that slips at its measured step-error rate. No
sampling and no scoring: noise-free values that credit a right trace's segments as well as blame a
wrong one's, through the same segment-reward-to-σ mapping as RREDCoT and Monte Carlo credit. The
testbed's ceiling of credit, where the oracle is the ceiling of blame only."""

from __future__ import annotations

import math

import torch

from rredcot.method import credit as C
from rredcot.method.registry import (
    Batch,
    CreditMethod,
    SegmentRewards,
    register_credit_method,
    register_reward_source,
)


def _log(value: float) -> float:
    return math.log(value) if value > 0.0 else C.LOG_VALUE_FLOOR


@register_reward_source("exact_values", reads=("value_space",), needs=("task_values", "outcome"))
def exact(assigner, batch: Batch) -> list[SegmentRewards]:  # noqa: ANN001
    """Values at RREDCoT's exit points from ``TraceInput.task_values`` (character offsets in).

    The thinking segments earn the change of value from ``cut_k`` to ``cut_{k+1}`` (``value_space``);
    the answer segment after the model's own exit earns the trace's own outcome against the value at
    that exit, as Monte Carlo credit's does."""
    cfg = assigner.cfg
    entropies = assigner.entropies(batch)
    out = []
    for j, (item, h) in enumerate(zip(batch.items, entropies, strict=True)):
        if item.task_values is None:
            raise ValueError(f"credit method {cfg.method!r} needs each trace's task_values")
        cuts = assigner.segment(batch, j, h)
        texts = batch.texts[j]
        offsets = [len("".join(texts[:c])) for c in cuts]
        values = item.task_values(offsets)
        if len(values) != len(cuts) or any(not 0.0 <= v <= 1.0 for v in values):
            raise ValueError(f"task_values must give one value in [0, 1] per exit point, got {values}")
        log_v = torch.tensor([_log(v) for v in values], dtype=torch.float64)
        n, answer_at, starts = len(item.completion_ids), batch.ends[j], batch.starts[j]
        answer_reward = None
        if answer_at is not None and answer_at < n:
            if item.outcome is None or not 0.0 <= item.outcome <= 1.0:
                raise ValueError(f"exact credit needs each trace's outcome in [0, 1], got {item.outcome}")
            answer_reward = _log(item.outcome) - float(log_v[-1])
            starts = [*starts, answer_at]
        rewards = C.value_rewards(log_v, cfg.value_space, answer_reward)
        out.append(SegmentRewards(rewards, starts, h, cuts, log_v, answer_reward=answer_reward))
    return out


register_credit_method(
    CreditMethod(
        "exact",
        "exact_values",
        None,
        "Exact values (synthetic task): the probability of ending right from each of RREDCoT's exit "
        "points, computed by the task for a policy slipping at its measured step-error rate; noise-free "
        "credit of right and wrong traces, the testbed's ceiling of credit.",
    )
)
