"""PRIME (Process Reinforcement through IMplicit rEwards, Cui et al., arXiv 2502.01456): token
advantages from an implicit process reward model's rewards and the outcome, registered as ``prime``
(docs/method.md, "PRIME").

The rule is :mod:`rredcot.method.prime`'s (its docstring gives it as PRIME's code applies it): the
token reward ``β·(log π_PRM − log π_ref)``, normalised over the batch, a leave-one-out baseline over
each group for it and for the outcome, the returns of both summed and whitened over every completion
token of the batch. This source only gathers the traces' inputs into the [B, T] tensors that rule
reads; the caller supplies them (the ``process_log_probs`` need: ``TraceInput.prm_log_probs``,
``ref_log_probs`` and ``group``) and owns the PRM and its update (``rredcot.adapter.prime``: once per
generation batch, on its completions' outcomes, the rewards read before the update, PRIME's
``update: after``).

Where our setting differs (docs/method.md, "PRIME", says why):

- **Groups.** PRIME's K samples of a prompt are the trainer's GRPO group (``num_generations``
  consecutive completions); every completion of each group is passed, an empty one included (it
  gets no advantage and counts in its group's baselines with 0).
- **Outcome.** Our outcome reward lies in [0, 1]; it is the PRM's label and the outcome reward.
- **Form.** The method gives every token its own advantage (the ``advantage`` form of
  ``rredcot.method.registry.CreditMethod``): the group's GRPO advantage is not multiplied in, the
  outcome's leave-one-out advantage (PRIME's RLOO) takes its place.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from rredcot.method import registry
from rredcot.method.prime import implicit_token_rewards, prime_advantages
from rredcot.method.registry import CreditMethod, SegmentRewards

if TYPE_CHECKING:
    from rredcot.method.registry import Batch, TraceInput


def group_size(items: list[TraceInput]) -> int:
    """The size of the batch's groups: the traces of a group (``TraceInput.group``) must be
    consecutive and every group must be as large."""
    if any(item.group is None for item in items):
        raise ValueError("PRIME credit needs each trace's group (the process_log_probs need)")
    sizes: list[int] = []
    seen: set[int] = set()
    previous = None
    for item in items:
        if item.group != previous:
            if item.group in seen:
                raise ValueError(f"the traces of group {item.group} are not consecutive")
            seen.add(item.group)  # type: ignore[arg-type]
            sizes.append(0)
            previous = item.group
        sizes[-1] += 1
    if len(set(sizes)) != 1:
        raise ValueError(f"PRIME credit needs groups of one size, got sizes {sorted(set(sizes))}")
    return sizes[0]


def batch_tensors(items: list[TraceInput]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The PRM's and the reference's token log-probabilities [B, T] (0 on padding), the completion
    mask [B, T] and the outcomes [B] of the traces, right-padded to the longest completion."""
    rows, width = len(items), max((len(item.completion_ids) for item in items), default=0)
    prm = torch.zeros(rows, width, dtype=torch.float64)
    ref = torch.zeros(rows, width, dtype=torch.float64)
    mask = torch.zeros(rows, width, dtype=torch.bool)
    outcomes = torch.zeros(rows, dtype=torch.float64)
    for i, item in enumerate(items):
        n = len(item.completion_ids)
        if item.prm_log_probs is None or item.ref_log_probs is None:
            raise ValueError("PRIME credit needs each trace's PRM and reference log-probabilities")
        if item.prm_log_probs.numel() != n or item.ref_log_probs.numel() != n:
            raise ValueError(
                f"PRM and reference log-probabilities must give one value per token ({n}), got "
                f"{item.prm_log_probs.numel()} and {item.ref_log_probs.numel()}"
            )
        if item.outcome is None or not 0.0 <= item.outcome <= 1.0:
            raise ValueError(f"PRIME credit needs each trace's outcome in [0, 1], got {item.outcome}")
        prm[i, :n] = item.prm_log_probs.detach().double().cpu()
        ref[i, :n] = item.ref_log_probs.detach().double().cpu()
        mask[i, :n] = True
        outcomes[i] = float(item.outcome)
    return prm, ref, mask, outcomes


@registry.register_reward_source(
    "implicit_prm", reads=("prime",), needs=("process_log_probs", "outcome"), segments=False
)
def implicit_prm(assigner, batch: Batch) -> list[SegmentRewards]:  # noqa: ANN001
    """PRIME's token advantages (arXiv 2502.01456): implicit process rewards
    ``prime.beta·(log π_PRM − log π_ref)`` from the caller's PRM and reference log-probabilities
    and each trace's outcome, combined as PRIME does over the batch's groups (leave-one-out
    baselines, returns, whitening).

    Each trace is one segment whose reward is its implicit outcome reward ``β·Σ_t q_t`` (the PRM's
    logit); ``advantages`` are the token advantages the trainer applies."""
    cfg = assigner.cfg.prime
    k = group_size(batch.items)
    prm, ref, mask, outcomes = batch_tensors(batch.items)
    token_rewards = implicit_token_rewards(prm, ref, mask, cfg.beta, cfg.granularity)
    advantages = prime_advantages(
        token_rewards,
        outcomes,
        mask,
        k,
        process_coef=cfg.process_coef,
        outcome_coef=cfg.outcome_coef,
        process_gamma=cfg.process_gamma,
        outcome_gamma=cfg.outcome_gamma,
        normalise=cfg.normalise,
        whiten=cfg.whiten,
    )
    out = []
    for i, item in enumerate(batch.items):
        n = len(item.completion_ids)
        score = cfg.beta * float((prm[i, :n] - ref[i, :n]).sum())
        out.append(
            SegmentRewards(
                torch.tensor([score] if n else [], dtype=torch.float64),
                [0] if n else [],
                advantages=advantages[i, :n].float(),
            )
        )
    return out


registry.register_credit_method(
    CreditMethod(
        "prime",
        "implicit_prm",
        None,
        "PRIME (arXiv 2502.01456): token rewards β·log(π_PRM/π_ref) from an implicit process reward "
        "model trained online on the outcomes, and the outcome's leave-one-out advantage, each with "
        "a leave-one-out baseline over the group, summed as returns and whitened, in place of the "
        "group's advantage.",
        form="advantage",
    )
)
