"""PRIME in the credit-fidelity study: its implicit reward model learns online, as in training.

PRIME's credit (``prime``; arXiv 2502.01456) reads an implicit process reward model (PRM) that a run
trains on its own outcomes, and a group of completions per prompt for its leave-one-out baselines.
On the model RL starts from, an untrained PRM equals its reference and pays the outcome's advantage
alone, so the study runs PRIME as a run does:

- **Groups.** Each analysis trace is scored in a group of ``rl.num_generations`` completions of its
  prompt: itself and ``num_generations − 1`` more, sampled from the same model with the study's
  sampling settings and graded like it, as the trainer's group would hold. Only the analysis trace's
  credit is read; the others serve PRIME's baselines and whitening, as the rest of a group does.
- **Online PRM.** The groups are taken ``rl.prompts_per_step`` at a time, a training step's batch.
  For each batch, one :meth:`rredcot.adapter.prime.ImplicitPrm.step` on its outcomes gives the PRM's
  and the reference's log-probabilities read before the update (PRIME's order), then
  ``CreditAssigner.assign`` turns them into PRIME's token advantages. The PRM (a trainable copy of
  the model) starts equal to its reference (the model itself), so the first batch gets the outcome's
  credit alone and later batches a PRM trained on the batches before them: over the study's traces
  PRIME sees as many updates as a run of that many steps gives it.
- **Cost.** The seconds of the PRM's step and of the credit over every completion of a batch, charged
  to the analysis traces in proportion (a batch's seconds times its analysis traces over its
  completions): what PRIME costs per completion in training. Sampling the rest of each group is not
  charged; a run samples its groups whatever its credit.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from rredcot.adapter.prime import ImplicitPrm, causal_log_probs
from rredcot.lm.generation import Generator, sample_seed
from rredcot.method.assign import CreditAssigner, TraceCredit
from rredcot.method.registry import TraceInput
from rredcot.method.settings import CreditConfig, prm_learning_rate


def companions(
    items: Sequence[TraceInput],
    trace_ids: Sequence[str],
    reward: Callable[[int, str], float],
    sampler: Generator,
    group: int,
    seed: int,
    sampling: Mapping[str, Any],
) -> list[list[TraceInput]]:
    """Each trace's group: a copy of the trace, then ``group − 1`` completions of its prompt, each from
    a random stream of its own (``seed``, the trace, its index), graded by ``reward(j, text)`` (``j``:
    the trace's index)."""
    extra = group - 1
    prefixes = [list(item.prompt_ids) for item in items for _ in range(extra)]
    seeds = [sample_seed(seed, "prime-group", tid, k) for tid in trace_ids for k in range(1, group)]
    sampled = sampler.sample(prefixes, seeds, **sampling) if prefixes else []
    groups = []
    for j, item in enumerate(items):
        own = sampled[j * extra : (j + 1) * extra]
        groups.append(
            [copy.copy(item)]  # PRIME's inputs are written onto the group's traces: not the shared one
            + [
                TraceInput(list(item.prompt_ids), list(c.token_ids), 0.0, [], outcome=reward(j, c.text))
                for c in own
            ]
        )
    return groups


def batch_tensors(
    items: Sequence[TraceInput], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``input_ids``, ``attention_mask`` [B, P + T] (prompts left-padded to P, completions right-padded
    to T) and the completion mask [B, T], as the trainer hands its batch to the PRM."""
    width_p = max(len(item.prompt_ids) for item in items)
    width_c = max(max(len(item.completion_ids) for item in items), 1)
    ids = torch.full((len(items), width_p + width_c), pad_id, dtype=torch.long)
    attention = torch.zeros_like(ids)
    for i, item in enumerate(items):
        p, c = len(item.prompt_ids), len(item.completion_ids)
        ids[i, width_p - p : width_p] = torch.tensor(item.prompt_ids, dtype=torch.long)
        ids[i, width_p : width_p + c] = torch.tensor(item.completion_ids, dtype=torch.long)
        attention[i, width_p - p : width_p + c] = 1
    return ids, attention, attention[:, width_p:].clone()


def online_prime(
    config: CreditConfig,
    model: torch.nn.Module,
    tokenizer: Any,
    groups: Sequence[Sequence[TraceInput]],
    groups_per_update: int,
    temperature: float,
    policy_lr: float,
    chunk: int = 16,
    progress: Any = None,
) -> tuple[list[TraceCredit], dict[str, float]]:
    """PRIME's credit of the first trace of every group, its PRM trained online over the groups
    ``groups_per_update`` at a time (at ``prime.lr``, else at PRIME's ratio to ``policy_lr``, the
    run's learning rate); and its cost (``seconds`` charged to the first traces,
    ``prm_seconds`` of the PRM's steps, ``completions`` scored, ``updates``, and the PRM's loss at its
    first and last update and its last ranking accuracy, PRIME's ``dpo_acc``)."""
    sizes = {len(g) for g in groups}
    if len(sizes) > 1:
        raise ValueError(f"PRIME's groups must be of one size, got {sorted(sizes)}")
    k = sizes.pop() if sizes else 1

    def log_probs(m: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, keep: int) -> torch.Tensor:
        return causal_log_probs(m, ids, mask, keep, temperature)

    prm_model = copy.deepcopy(model).train()
    for p in prm_model.parameters():
        p.requires_grad_(True)
    lr = prm_learning_rate(config.prime, policy_lr)  # the PRM learns as it would beside the run's policy
    prm = ImplicitPrm(prm_model, model.eval(), config.prime, log_probs, k, chunk, lr=lr)
    assigner = CreditAssigner(tokenizer, config)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    credits: list[TraceCredit] = []
    cost = {"seconds": 0.0, "rollouts": 0.0, "rollout_tokens": 0.0, "prm_seconds": 0.0, "completions": 0.0}
    cost["updates"] = 0.0
    for start in range(0, len(groups), groups_per_update):
        part = list(groups[start : start + groups_per_update])
        items = [item for g in part for item in g]
        t0 = time.perf_counter()
        ids, attention, completion = batch_tensors(items, pad)
        outcomes = torch.tensor([float(item.outcome or 0.0) for item in items])
        step = prm.step(ids, attention, completion, outcomes)  # the rewards are read before the update
        prm.supply(items, list(range(len(items))), step)
        with torch.inference_mode():
            found = assigner.assign(model, items)
        seconds = time.perf_counter() - t0
        credits += found[::k]
        cost["seconds"] += seconds * len(part) / len(items)
        cost["prm_seconds"] += step.seconds
        cost["completions"] += len(items)
        cost["updates"] += 1
        cost["prm_loss_first"] = cost.get("prm_loss_first", step.loss)
        cost["prm_loss_last"], cost["prm_accuracy_last"] = step.loss, step.accuracy
        if progress is not None:
            progress.update(len(part))
    return credits, cost
