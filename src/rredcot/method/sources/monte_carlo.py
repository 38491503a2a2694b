"""Monte Carlo values (VinePPO-style): the mean outcome of policy rollouts from each of RREDCoT's exit
points, through the same segment-reward-to-σ mapping: the unbiased, expensive reference."""

from __future__ import annotations

from rredcot.method import credit as C
from rredcot.method.registry import (
    Batch,
    CreditMethod,
    SegmentRewards,
    register_credit_method,
    register_reward_source,
)


@register_reward_source("mc_values", reads=("mc", "value_space"), needs=("rollouts", "outcome"))
def monte_carlo(assigner, batch: Batch) -> list[SegmentRewards]:  # noqa: ANN001
    """Values at RREDCoT's exit points from ``mc.samples`` rollouts each (``assign(rollouts=...)``).

    The thinking segments earn the change of value from ``cut_k`` to ``cut_{k+1}`` (``value_space``);
    the answer segment after the model's own exit earns the trace's own outcome against the value at
    that exit (the outcome counted as ``samples`` equal rollouts, so both sides carry the same
    smoothing)."""
    cfg = assigner.cfg
    if batch.rollouts is None:
        raise ValueError(f"credit method {cfg.method!r} needs rollouts= (policy rollouts and rewards)")
    entropies = assigner.entropies(batch)
    cuts = [assigner.segment(batch, j, h) for j, h in enumerate(entropies)]
    with assigner.timed("rollouts"):
        sums = batch.rollouts(batch.policy, batch.items, cuts)
    if len(sums) != len(batch.items) or any(len(s) != len(c) for s, c in zip(sums, cuts, strict=True)):
        raise ValueError("rollouts must return one outcome sum per cut of every trace")
    m = cfg.mc.samples
    out = []
    for j, item in enumerate(batch.items):
        n, answer_at, starts = len(item.completion_ids), batch.ends[j], batch.starts[j]
        log_v = C.mc_log_values(sums[j], m)
        answer_reward = None
        if answer_at is not None and answer_at < n:
            if item.outcome is None or not 0.0 <= item.outcome <= 1.0:
                raise ValueError(
                    f"Monte Carlo credit needs each trace's outcome in [0, 1], got {item.outcome}"
                )
            answer_reward = float(C.mc_log_values([item.outcome * m], m)[0] - log_v[-1])
            starts = [*starts, answer_at]
        rewards = C.value_rewards(log_v, cfg.value_space, answer_reward)
        out.append(SegmentRewards(rewards, starts, entropies[j], cuts[j], log_v, answer_reward=answer_reward))
    return out


register_credit_method(
    CreditMethod(
        "mc",
        "mc_values",
        None,
        "Monte Carlo values (VinePPO-style): the mean outcome of policy rollouts from each of RREDCoT's "
        "exit points, through the same segment-reward-to-σ mapping; the unbiased, expensive reference.",
    )
)
