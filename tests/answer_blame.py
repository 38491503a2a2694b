"""A credit method of one module: the example of docs/library.md, "Adding a credit method".

``answer_blame`` puts a trace's whole redistributed share on the answer after the model's own exit
(a wrong trace blames its final solution, a right one credits it); traces that never exit get
uniform credit. Importing the module registers it.
"""

from __future__ import annotations

import torch

from rredcot.method.registry import (
    CreditMethod,
    SegmentRewards,
    register_credit_method,
    register_reward_source,
)


@register_reward_source("answer_blame")
def answer_blame(assigner, batch):  # noqa: ANN001, ANN201
    """+1 (right trace) or -1 (wrong) for the answer segment, 0 for every thinking segment."""
    out = []
    for j, (item, h) in enumerate(zip(batch.items, assigner.entropies(batch), strict=True)):
        assigner.segment(batch, j, h)  # RREDCoT's thinking segments into batch.starts[j]
        starts, end = batch.starts[j], batch.ends[j]
        rewards = torch.zeros(len(starts) + 1, dtype=torch.float64)
        if end is not None and end < len(item.completion_ids):
            starts = [*starts, end]  # the answer segment
            rewards[-1] = 1.0 if item.advantage > 0 else -1.0
        out.append(SegmentRewards(rewards[: len(starts)], starts, h))
    return out


register_credit_method(
    CreditMethod("answer_blame", "answer_blame", None, "The answer segment takes the redistributed share.")
)
