"""The implicit process reward model of PRIME's credit (``prime``; arXiv 2502.01456) inside the
trainer: the trainable PRM, its frozen reference, its AdamW optimizer and its update on each
generation batch (docs/method.md, "PRIME").

``RREDCoTTrainer`` builds an :class:`ImplicitPrm` when its credit method needs
``process_log_probs``: the PRM a trainable copy of the model RL starts from, the reference a frozen
one (TRL's reference model when ``beta`` > 0, whose log-probabilities TRL has computed already).
On each generation batch, :meth:`ImplicitPrm.step`, in this order:

1. the reference's log-probabilities of the completion tokens (no gradient);
2. the PRM's, with gradient, in chunks of rows; the loss of each chunk
   (:func:`rredcot.method.prime.prm_loss` on the completions' outcomes, weighted by its share of the
   rows) backpropagated as it is computed;
3. in a multi-process run, the gradients averaged over the processes (each keeps a whole PRM and
   learns from its share of the batch, so every copy takes the same step);
4. the gradient norm clipped to ``prime.grad_clip``, one AdamW step.

The token rewards the policy is trained on come from the PRM log-probabilities of step 2, before
the update (PRIME's ``update: after``); the reward source (``rredcot.method.sources.prime``) turns
them into token advantages. The PRM's weights and optimizer state are saved in every checkpoint and
restored on resume (:meth:`save`, :meth:`load`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from rredcot.method.prime import implicit_reward_accuracy, implicit_token_rewards, prm_loss
from rredcot.method.registry import TraceInput
from rredcot.method.settings import PrimeSettings

LogProbs = Callable[[torch.nn.Module, Tensor, Tensor, int], Tensor]
"""``log_probs(model, input_ids, attention_mask, logits_to_keep)``: [B, logits_to_keep] log-probabilities
of the last ``logits_to_keep`` tokens of each row under the model, as the trainer computes its policy's
(differentiable when gradients are on)."""


def causal_log_probs(
    model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor, keep: int, temperature: float = 1.0
) -> Tensor:
    """A :data:`LogProbs` for callers without TRL's trainer: the log-probabilities of the last ``keep``
    tokens of each row at ``temperature``, rows left-padded (positions counted from each row's first
    real token, as generation counts them, so a padded row scores as it would alone) and
    differentiable when gradients are on."""
    positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, use_cache=False)
    logits = out.logits[:, -keep - 1 : -1, :].float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, -keep:, None]).squeeze(-1)


STATE_FILE = "prime_prm.pt"
"""In a checkpoint folder: the PRM's weights and its optimizer's state."""


@dataclass
class PrmStep:
    """What one update of the PRM gives: the log-probabilities its rewards are read from (before the
    update), and how the update went."""

    prm_log_probs: Tensor  # [B, T], detached, 0 on padding
    ref_log_probs: Tensor  # [B, T], 0 on padding
    loss: float
    accuracy: float  # PRIME's dpo_acc: how often the PRM ranks a group's completions as their outcomes do
    grad_norm: float  # before clipping
    seconds: float


class ImplicitPrm:
    """PRIME's implicit PRM, its reference, and its optimizer (AdamW, constant learning rate)."""

    def __init__(
        self,
        model: torch.nn.Module,
        reference: torch.nn.Module | None,
        settings: PrimeSettings,
        log_probs: LogProbs,
        group_size: int,
        chunk: int,
        sync: Callable[[list[Tensor]], None] | None = None,
        lr: float | None = None,
    ) -> None:
        """``model``: the trainable PRM; ``reference``: the frozen reference, or None when the caller
        passes the reference's log-probabilities to :meth:`step`; ``chunk``: rows per forward;
        ``sync``: averages the PRM's gradients over the processes of a multi-process run, in place,
        before clipping (each process keeps a whole PRM and updates it on its share of the batch, so
        every copy takes the same step: ``rredcot.adapter.distributed.average_gradients``); ``lr``: the
        PRM's learning rate, ``settings.lr`` when None (``rredcot.method.settings.prm_learning_rate``
        resolves a null one from the policy's)."""
        lr = settings.lr if lr is None else lr
        if lr is None:
            raise ValueError(
                "the PRM's learning rate is not set: pass lr= (prm_learning_rate) or settings.lr"
            )
        if chunk < 1:
            raise ValueError(f"chunk must be positive, got {chunk}")
        self.model = model
        self.reference = reference
        self.settings = settings
        self.log_probs = log_probs
        self.group_size = group_size
        self.chunk = chunk
        self.sync = sync
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=float(lr),
            betas=(0.9, 0.999),
            weight_decay=settings.weight_decay,
        )

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        return (p for p in self.model.parameters() if p.requires_grad)

    def memory_bytes(self) -> int:
        """Bytes the extra models hold: the PRM's weights, gradients and AdamW moments, and the
        reference's weights when it is a model of its own."""
        params = list(self.model.parameters())
        total = sum(p.numel() * p.element_size() for p in params)
        total += sum(p.numel() * p.element_size() for p in params if p.requires_grad)  # gradients
        for state in self.optimizer.state.values():
            total += sum(v.numel() * v.element_size() for v in state.values() if torch.is_tensor(v))
        if self.reference is not None:
            total += sum(p.numel() * p.element_size() for p in self.reference.parameters())
        return total

    def step(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        completion_mask: Tensor,
        outcomes: Tensor,
        ref_log_probs: Tensor | None = None,
    ) -> PrmStep:
        """Update the PRM once on a batch of completions and their outcomes in [0, 1]; return the
        log-probabilities read before the update. ``input_ids`` and ``attention_mask`` [B, L] hold
        prompt and completion; the completion is the last T = ``completion_mask.shape[1]`` columns."""
        t0 = time.perf_counter()
        cfg = self.settings
        rows, width = completion_mask.shape
        mask = completion_mask.bool()
        labels = outcomes.to(device=input_ids.device, dtype=torch.float32)
        if ref_log_probs is None:
            if self.reference is None:
                raise ValueError("the PRM step needs the reference's log-probabilities or a reference model")
            with torch.no_grad():
                ref_log_probs = torch.cat(
                    [
                        self.log_probs(self.reference, input_ids[a:b], attention_mask[a:b], width)
                        for a, b in _chunks(rows, self.chunk)
                    ]
                )
        ref_log_probs = torch.where(mask, ref_log_probs.detach().float(), 0.0)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        parts, loss = [], 0.0
        with torch.enable_grad():
            for a, b in _chunks(rows, self.chunk):
                lp = self.log_probs(self.model, input_ids[a:b], attention_mask[a:b], width)
                part = prm_loss(lp.float(), ref_log_probs[a:b], mask[a:b], labels[a:b], cfg.beta)
                (part * ((b - a) / rows)).backward()
                loss += float(part.detach()) * (b - a) / rows
                parts.append(lp.detach().float())
        if self.sync is not None:
            self.sync([p.grad for p in self.parameters() if p.grad is not None])
        norm = torch.nn.utils.clip_grad_norm_(list(self.parameters()), cfg.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        prm_log_probs = torch.where(mask, torch.cat(parts), 0.0)
        rewards = implicit_token_rewards(prm_log_probs, ref_log_probs, mask, cfg.beta, cfg.granularity)
        accuracy = implicit_reward_accuracy(rewards, labels, mask, self.group_size)
        return PrmStep(prm_log_probs, ref_log_probs, loss, accuracy, float(norm), time.perf_counter() - t0)

    def supply(self, items: list[TraceInput], rows: list[int], result: PrmStep) -> None:
        """Give each trace (``items[j]`` is the batch's row ``rows[j]``) its PRM and reference
        log-probabilities and its group (the ``process_log_probs`` need)."""
        for item, i in zip(items, rows, strict=True):
            n = len(item.completion_ids)
            item.prm_log_probs = result.prm_log_probs[i, :n].cpu()
            item.ref_log_probs = result.ref_log_probs[i, :n].cpu()
            item.group = i // self.group_size

    # -- checkpoints -------------------------------------------------------------------------------
    def save(self, folder: str | Path) -> Path:
        """Write the PRM's weights and its optimizer's state into a checkpoint folder."""
        path = Path(folder) / STATE_FILE
        torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}, path)
        return path

    def load(self, folder: str | Path) -> None:
        """Restore the PRM's weights and optimizer state from a checkpoint folder written by
        :meth:`save`."""
        path = Path(folder) / STATE_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{path}: the checkpoint holds no PRIME reward model to resume")
        device = next(self.model.parameters()).device
        state = torch.load(path, map_location=device, weights_only=True)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


def _chunks(rows: int, size: int) -> list[tuple[int, int]]:
    return [(a, min(a + size, rows)) for a in range(0, rows, size)]
