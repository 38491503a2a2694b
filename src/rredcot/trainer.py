"""``RREDCoTTrainer``: TRL's GRPOTrainer with token-level credit assignment (METHOD.md 2.5).

The adapter is deliberately thin. The parent generates, rewards and computes one advantage per
completion; this class turns each advantage into per-token advantages ``A · σ_t · |o|`` so that
TRL's sequence-mean loss (``loss_type="grpo"``) becomes ``Σ_t σ_t ℓ_t``. The credit method chooses σ
(:func:`rredcot.credit.credit_multiplier`): ``uniform`` is exactly 1.0 (bit for bit stock GRPO),
``entropy`` weights tokens by the policy's entropy, ``rredcot`` and ``rredcot+entropy`` spread the
advantage over segments by the change of exit-point values, scored by teacher forcing the reference
pairs with the value model in a single pass per trace (:mod:`rredcot.prefix_scoring`).
"""

from __future__ import annotations

import copy
import math
import time
from typing import Any

import torch
from trl import GRPOTrainer

from rredcot import credit as C
from rredcot.assign import CreditAssigner, CreditConfig, TraceCredit, TraceInput, credit_record
from rredcot.grading import grade

__all__ = ["CreditConfig", "RREDCoTTrainer", "TraceCredit", "credit_record"]


class RREDCoTTrainer(GRPOTrainer):
    """GRPOTrainer whose advantages are redistributed over tokens by a credit method.

    Pass ``credit=CreditConfig(...)`` in addition to the usual GRPOTrainer arguments. Dataset rows
    need an ``answer`` column (the reward's label) and, for ``rredcot*``, a ``reference`` column with
    the reference solution text (the reasoning before the boxed answer). Credit records of sampled
    traces accumulate in ``credit_views`` when ``view_every`` > 0.
    """

    def __init__(self, *args: Any, credit: CreditConfig | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.credit = credit or CreditConfig()
        self.credit_views: list[dict[str, Any]] = []
        self.assigner = CreditAssigner(self.processing_class, self.credit)
        self._value_model: torch.nn.Module | None = None
        if C.needs_exit_values(self.credit.method) and self.credit.value_model == "reference":
            # TRL keeps a reference model only when beta > 0; otherwise freeze a copy of the start.
            ref = getattr(self, "ref_model", None)
            self._value_model = (
                ref if ref is not None else _frozen_copy(self.accelerator.unwrap_model(self.model))
            )
        if self.credit.method != "uniform" and self.loss_type != "grpo":
            # σ sums to 1 per trace only under the sequence-mean normaliser.
            print(f"[rredcot] note: loss_type={self.loss_type!r}; σ·|o| is applied under that normaliser")

    # -- the override ----------------------------------------------------------------------------
    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        out = super()._generate_and_score_completions(inputs)
        advantages = out["advantages"]
        mask = out["completion_mask"]
        per_token = torch.ones_like(mask, dtype=advantages.dtype)
        if self.credit.method != "uniform":
            t0 = time.perf_counter()
            per_token = self._credit_multipliers(inputs, out).to(advantages.dtype)
            self._metrics["train"]["credit/seconds"].append(time.perf_counter() - t0)
        # Padding positions are masked out of the loss; keep the factor 1 there so nothing changes.
        out["advantages"] = advantages.unsqueeze(1) * torch.where(mask.bool(), per_token, 1.0)
        return out

    # -- credit ----------------------------------------------------------------------------------
    def _reference_pairs(self, inputs: list[dict[str, Any]], texts: list[str], i: int) -> TraceInput:
        """The dataset pair of row i, then (optionally) the final solutions of correct group mates."""
        row = inputs[i]
        answer = str(row["answer"])
        pairs = [(row.get("reference") or "", answer)]
        if self.credit.group_pairs:
            for j, other in enumerate(inputs):
                if other["prompt"] == row["prompt"] and grade(texts[j], answer):
                    final = self.assigner.final_solution(texts[j])
                    if final is not None and final not in pairs:
                        pairs.append(final)
        log_q = None
        if self.credit.proposal == "given":
            if row.get("reference_log_q") is None:
                raise ValueError("proposal 'given' needs a 'reference_log_q' column in the dataset")
            log_q = torch.tensor([float(row["reference_log_q"])], dtype=torch.float64)
        utility = torch.ones(len(pairs), dtype=torch.float64)
        if row.get("reference_utility") is not None:
            utility[0] = float(row["reference_utility"])
        return TraceInput([], [], 0.0, pairs, log_q, utility)

    def _credit_multipliers(self, inputs: list[dict[str, Any]], out: dict[str, Any]) -> torch.Tensor:
        prompt_ids, prompt_mask = out["prompt_ids"], out["prompt_mask"]
        completion_ids, completion_mask = out["completion_ids"], out["completion_mask"]
        advantages = out["advantages"]
        per_token = torch.ones(completion_ids.shape, dtype=torch.float32, device=completion_ids.device)
        lengths = completion_mask.sum(dim=1).tolist()
        rows = [i for i in range(len(inputs)) if float(advantages[i]) != 0.0 and lengths[i] > 0]
        if not rows:  # every group had equal rewards: nothing to redistribute
            self._metrics["train"]["credit/traces"].append(0.0)
            return per_token
        texts = [""] * len(inputs)
        if self.credit.group_pairs and C.needs_exit_values(self.credit.method):
            every = [completion_ids[i][: lengths[i]].tolist() for i in range(len(inputs))]
            texts = self.processing_class.batch_decode(every, skip_special_tokens=True)
        items = []
        for i in rows:
            ref = self._reference_pairs(inputs, texts, i)
            ref.prompt_ids = prompt_ids[i][prompt_mask[i].bool()].tolist()
            ref.completion_ids = completion_ids[i][: lengths[i]].tolist()
            ref.advantage = float(advantages[i])
            items.append(ref)
        policy = self.accelerator.unwrap_model(self.model)
        was_training = policy.training
        policy.eval()
        try:
            credits = self.assigner.assign(policy, items, self._value_model)
        finally:
            policy.train(was_training)
        stats = _CreditStats()
        for i, tc in zip(rows, credits, strict=True):
            per_token[i, : lengths[i]] = tc.multiplier.to(per_token.device)
            stats.add(tc)
        for name, value in stats.summary().items():
            self._metrics["train"][f"credit/{name}"].append(value)
        self._keep_views(inputs, rows, [it.completion_ids for it in items], advantages, credits)
        return per_token

    def _keep_views(
        self,
        inputs: list[dict[str, Any]],
        rows: list[int],
        completions: list[list[int]],
        advantages: torch.Tensor,
        credits: list[TraceCredit],
    ) -> None:
        """Keep credit records of a few traces (alternating advantage signs) every ``view_every`` steps."""
        cfg = self.credit
        step = int(self.state.global_step)
        if (
            cfg.view_every <= 0
            or step % cfg.view_every != 0
            or any(v["step"] == step for v in self.credit_views)
        ):
            return
        pos = [j for j, i in enumerate(rows) if float(advantages[i]) > 0]
        neg = [j for j, i in enumerate(rows) if float(advantages[i]) < 0]
        order = [j for pair in zip(neg, pos, strict=False) for j in pair] + neg[len(pos) :] + pos[len(neg) :]
        # A trace that is only an EOS has two equal cuts (0, 0): nothing to picture.
        order = [j for j in order if len(set(credits[j].cuts)) == len(credits[j].cuts)]
        for j in order[: cfg.view_samples]:
            i, tc = rows[j], credits[j]
            self.credit_views.append(
                credit_record(
                    tokens=self.assigner.token_texts(completions[j]),
                    credit=tc,
                    method=cfg.method,
                    step=step,
                    trace_id=f"step{step}-{j}",
                    prompt=str(inputs[i]["prompt"]),
                    answer=str(inputs[i]["answer"]),
                    advantage=float(advantages[i]),
                    baseline_text=self.assigner.baseline_text(tc),
                )
            )


def _frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    frozen = copy.deepcopy(model).eval()
    for p in frozen.parameters():
        p.requires_grad_(False)
    return frozen


class _CreditStats:
    """Running σ statistics over the traces of one generation batch."""

    def __init__(self) -> None:
        self.max_share: list[float] = []
        self.sigma_entropy: list[float] = []
        self.segments: list[int] = []
        self.exit_log_value: list[float] = []

    def add(self, tc: TraceCredit) -> None:
        length = tc.multiplier.numel()
        sigma = (tc.multiplier / length).double()
        self.max_share.append(float(sigma.max()))
        nz = sigma[sigma > 0]
        # Normalised entropy of σ: 1.0 = uniform over tokens, lower = concentrated credit.
        ent = float(-(nz * nz.log()).sum()) / math.log(length) if length > 1 else 1.0
        self.sigma_entropy.append(ent)
        if tc.segment_starts:
            self.segments.append(len(tc.segment_starts))
        finite = tc.log_values[torch.isfinite(tc.log_values)]
        if finite.numel():
            self.exit_log_value.append(float(finite.mean()))

    def summary(self) -> dict[str, float]:
        def mean(xs: list[float] | list[int]) -> float:
            return float(sum(xs) / len(xs)) if xs else float("nan")

        return {
            "traces": float(len(self.sigma_entropy)),
            "sigma_max_share": mean(self.max_share),
            "sigma_norm_entropy": mean(self.sigma_entropy),
            "segments": mean(self.segments),
            "exit_log_value": mean(self.exit_log_value),
        }
