"""``RREDCoTTrainer``: TRL's GRPOTrainer with segment-level credit assignment (METHOD.md 2.5).

The adapter is deliberately thin. The parent generates, rewards and computes one advantage per
completion; this class turns each advantage into per-token advantages ``A · σ_t · |o|`` so that
TRL's sequence-mean loss (``loss_type="grpo"``) becomes ``Σ_t σ_t ℓ_t``. With ``credit="uniform"`` the
factor is exactly 1.0 and training is bit for bit stock GRPO. With ``credit="rredcot"`` σ comes from
:mod:`rredcot.credit`: segments from keyword + entropy merging, exit-point values scored by teacher
forcing the reference solution and answer with the policy that generated the batch.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from trl import GRPOTrainer

from rredcot import credit as C
from rredcot import segmentation as S
from rredcot.exit_scoring import ExitScores, TraceExits, score_traces


@dataclass
class CreditConfig:
    """How the sequence advantage is spread over a completion's tokens."""

    method: str = "rredcot"
    """``uniform`` (σ = 1/|o|, stock GRPO) or ``rredcot`` (segment-level redistribution)."""
    n_segments: int = 6
    """Target number of segments per trace (K); K+1 exit points are scored."""
    mix: float = 0.5
    """σ = (1-mix)/|o| + mix · segment share; 0 gives uniform credit."""
    keywords: tuple[str, ...] = S.DEFAULT_KEYWORDS
    """Sentence-initial discourse keywords that start a new piece."""
    split_on_newline: bool = True
    """Start a new piece after every newline."""
    exit_string: str = "</think>\n"
    """Text that closes the thinking block at an exit point."""
    answer_prefix: str = " \\boxed{"
    """Text between the reference solution and the reference answer."""
    answer_suffix: str = "}"
    """Text after the reference answer."""
    max_batch_tokens: int = 32768
    """Padded-token budget of one exit-scoring forward pass (bounds memory)."""

    def __post_init__(self) -> None:
        if self.method not in ("uniform", "rredcot"):
            raise ValueError(f"unknown credit method {self.method!r}; expected 'uniform' or 'rredcot'")
        self.keywords = tuple(self.keywords)


@dataclass
class TraceCredit:
    """Credit computed for one completion (kept for logging and inspection)."""

    multiplier: torch.Tensor
    n_segments: int
    log_values: torch.Tensor = field(default_factory=lambda: torch.empty(0))


class RREDCoTTrainer(GRPOTrainer):
    """GRPOTrainer whose advantages are redistributed over tokens by a credit method.

    Pass ``credit=CreditConfig(...)`` in addition to the usual GRPOTrainer arguments. Dataset rows
    need an ``answer`` column (the reward's label) and, for ``rredcot``, a ``reference`` column with
    the reference solution text (the reasoning before the boxed answer).
    """

    def __init__(self, *args: Any, credit: CreditConfig | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.credit = credit or CreditConfig()
        self._token_text: dict[int, str] = {}
        self._encoded: dict[str, list[int]] = {}
        if self.credit.method == "rredcot" and self.loss_type != "grpo":
            # σ sums to 1 per trace only under the sequence-mean normaliser.
            print(f"[rredcot] note: loss_type={self.loss_type!r}; σ·|o| is applied under that normaliser")

    # -- helpers ---------------------------------------------------------------------------------
    def _encode(self, text: str) -> list[int]:
        if text not in self._encoded:
            self._encoded[text] = self.processing_class(text, add_special_tokens=False)["input_ids"]
        return self._encoded[text]

    def _token_texts(self, ids: list[int]) -> list[str]:
        missing = [t for t in set(ids) if t not in self._token_text]
        if missing:
            for tid, text in zip(
                missing, self.processing_class.batch_decode([[t] for t in missing]), strict=True
            ):
                self._token_text[tid] = text
        return [self._token_text[t] for t in ids]

    def _segments(self, completion: list[int], entropies: torch.Tensor) -> list[int]:
        """Segment start indices of one completion (keyword pieces merged by entropy)."""
        return S.segment_trace(
            self._token_texts(completion),
            entropies[: len(completion)].tolist(),
            self.credit.n_segments,
            keywords=self.credit.keywords,
        )

    def _credit_from_scores(
        self, starts: list[int], n: int, scores: ExitScores, advantage: float
    ) -> TraceCredit:
        """σ·|o| of one trace from its exit-point scores (one reference pair, q uniform, utility 1)."""
        zeros = torch.zeros_like(scores.log_p_solution)[:, None]
        log_v = C.pr_log_value(
            scores.log_p_solution[:, None], scores.log_p_answer[:, None], zeros, zeros + 1.0
        )
        rewards = C.segment_rewards(log_v)
        mult = C.token_multiplier(
            S.segment_ids_from_starts(starts, n), rewards, advantage, mix=self.credit.mix
        )
        return TraceCredit(mult, len(starts), log_v)

    # -- the override ----------------------------------------------------------------------------
    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        out = super()._generate_and_score_completions(inputs)
        advantages = out["advantages"]
        mask = out["completion_mask"]
        per_token = torch.ones_like(mask, dtype=advantages.dtype)
        if self.credit.method == "rredcot":
            t0 = time.perf_counter()
            per_token = self._rredcot_multipliers(inputs, out).to(advantages.dtype)
            self._metrics["train"]["credit/seconds"].append(time.perf_counter() - t0)
        # Padding positions are masked out of the loss; keep the factor 1 there so nothing changes.
        out["advantages"] = advantages.unsqueeze(1) * torch.where(mask.bool(), per_token, 1.0)
        return out

    def _rredcot_multipliers(self, inputs: list[dict[str, Any]], out: dict[str, Any]) -> torch.Tensor:
        prompt_ids, prompt_mask = out["prompt_ids"], out["prompt_mask"]
        completion_ids, completion_mask = out["completion_ids"], out["completion_mask"]
        advantages = out["advantages"]
        per_token = torch.ones(completion_ids.shape, dtype=torch.float32, device=completion_ids.device)
        rows = [i for i in range(len(inputs)) if float(advantages[i]) != 0.0]
        if not rows:  # every group had equal rewards: nothing to redistribute
            self._metrics["train"]["credit/traces"].append(0.0)
            return per_token
        model = self.accelerator.unwrap_model(self.model)
        was_training = model.training
        model.eval()
        try:
            entropies = self._completion_entropies(
                model, prompt_ids[rows], prompt_mask[rows], completion_ids[rows], completion_mask[rows]
            )
            specs, meta = [], []
            for j, i in enumerate(rows):
                length = int(completion_mask[i].sum())
                if length == 0:
                    continue
                completion = completion_ids[i][:length].tolist()
                starts = self._segments(completion, entropies[j])
                reference = inputs[i].get("reference") or ""
                # The final exit follows the whole trace but not its EOS: nothing is read after EOS.
                scored = (
                    completion[:-1] if completion[-1] == self.processing_class.eos_token_id else completion
                )
                cuts = [min(c, len(scored)) for c in S.exit_cuts(starts, length)]
                specs.append(
                    TraceExits(
                        prompt_ids[i][prompt_mask[i].bool()].tolist(),
                        scored,
                        cuts,
                        self._encode(reference) if reference else [],
                        self._encode(str(inputs[i]["answer"])),
                    )
                )
                meta.append((i, starts, length))
            cfg = self.credit
            scores = score_traces(
                model,
                specs,
                self._encode(cfg.exit_string),
                self._encode(cfg.answer_prefix),
                self._encode(cfg.answer_suffix),
                max_batch_tokens=cfg.max_batch_tokens,
            )
            stats = _CreditStats()
            for (i, starts, length), sc in zip(meta, scores, strict=True):
                tc = self._credit_from_scores(starts, length, sc, float(advantages[i]))
                per_token[i, :length] = tc.multiplier.to(per_token.device)
                stats.add(tc, length)
        finally:
            model.train(was_training)
        for name, value in stats.summary().items():
            self._metrics["train"][f"credit/{name}"].append(value)
        return per_token

    @torch.no_grad()
    def _completion_entropies(
        self,
        model: torch.nn.Module,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        completion_ids: torch.Tensor,
        completion_mask: torch.Tensor,
    ) -> torch.Tensor:
        """Predictive entropy (bits) at every completion position, one batched forward pass."""
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention = torch.cat([prompt_mask, completion_mask], dim=1)
        logits = model(input_ids=input_ids, attention_mask=attention, use_cache=False).logits
        # Position t predicts token t+1: the completion's predictions start one before it.
        t = completion_ids.shape[1]
        return C.token_entropies(logits[:, -t - 1 : -1, :]).cpu()


class _CreditStats:
    """Running σ statistics over the traces of one generation batch."""

    def __init__(self) -> None:
        self.max_share: list[float] = []
        self.sigma_entropy: list[float] = []
        self.segments: list[int] = []
        self.exit_log_value: list[float] = []

    def add(self, tc: TraceCredit, length: int) -> None:
        sigma = (tc.multiplier[:length] / length).double()
        self.max_share.append(float(sigma.max()))
        nz = sigma[sigma > 0]
        # Normalised entropy of σ: 1.0 = uniform over tokens, lower = concentrated credit.
        ent = float(-(nz * nz.log()).sum()) / math.log(length) if length > 1 else 1.0
        self.sigma_entropy.append(ent)
        self.segments.append(tc.n_segments)
        finite = tc.log_values[torch.isfinite(tc.log_values)]
        if finite.numel():
            self.exit_log_value.append(float(finite.mean()))

    def summary(self) -> dict[str, float]:
        def mean(xs: list[float] | list[int]) -> float:
            return float(sum(xs) / len(xs)) if xs else float("nan")

        return {
            "traces": float(len(self.segments)),
            "sigma_max_share": mean(self.max_share),
            "sigma_norm_entropy": mean(self.sigma_entropy),
            "segments": mean(self.segments),
            "exit_log_value": mean(self.exit_log_value),
        }
