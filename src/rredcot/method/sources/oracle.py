"""Perfect blame: the task says where a wrong trace first goes wrong (only the synthetic task can),
and that segment of RREDCoT's own segmentation takes all the blame: the ceiling of segment-level
blame, the testbed's check that credit can matter."""

from __future__ import annotations

from rredcot.method import credit as C
from rredcot.method import segmentation as S
from rredcot.method.registry import (
    Batch,
    CreditMethod,
    SegmentRewards,
    register_credit_method,
    register_reward_source,
)


@register_reward_source("oracle", needs=("culprit",))
def oracle(assigner, batch: Batch) -> list[SegmentRewards]:  # noqa: ANN001
    """-1 for the segment holding the character where the trace first goes wrong (``TraceInput.culprit``),
    0 elsewhere; thinking segments, then the answer segment. No scoring."""
    out = []
    for j, (item, h) in enumerate(zip(batch.items, assigner.entropies(batch), strict=True)):
        assigner.segment(batch, j, h)
        n, answer_at = len(item.completion_ids), batch.ends[j]
        starts = batch.starts[j]
        answered = answer_at is not None and answer_at < n
        if answered:
            starts = [s for s in starts if s < answer_at] + [answer_at]
        starts = starts or [0]
        segment = None
        if item.culprit is not None:
            token = S.token_at(batch.texts[j], item.culprit)
            if token is None:
                raise ValueError(f"culprit character {item.culprit} of an empty completion")
            segment = max(k for k, s in enumerate(starts) if s <= token)
        rewards = C.oracle_segment_rewards(len(starts), segment)
        out.append(SegmentRewards(rewards, starts, h, answer_reward=float(rewards[-1]) if answered else None))
    return out


register_credit_method(
    CreditMethod(
        "oracle",
        "oracle",
        None,
        "Perfect blame (synthetic task): a wrong trace's blame goes to the segment where it first goes "
        "wrong, the same segments and σ as RREDCoT; the ceiling of segment-level blame.",
    )
)
