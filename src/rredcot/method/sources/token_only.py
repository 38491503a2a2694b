"""No segments: the whole trace is one, and a method can only weight its tokens."""

from __future__ import annotations

import torch

from rredcot.method.registry import (
    Batch,
    CreditMethod,
    SegmentRewards,
    register_credit_method,
    register_reward_source,
)


@register_reward_source("none", segments=False)
def no_segments(assigner, batch: Batch) -> list[SegmentRewards]:  # noqa: ANN001
    """No segment rewards: one forward pass for the policy's token entropies (token weighting)."""
    return [
        SegmentRewards(torch.zeros(0, dtype=torch.float64), [0] if item.completion_ids else [], entropies=h)
        for item, h in zip(batch.items, assigner.entropies(batch), strict=True)
    ]


register_credit_method(CreditMethod("uniform", "none", None, "σ = 1/|o|: GRPO's uniform spread."))
register_credit_method(
    CreditMethod(
        "entropy",
        "none",
        "entropy",
        "Token-entropy weighting of the whole trace (docs/method.md, 'Credit methods').",
    )
)
