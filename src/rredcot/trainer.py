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
from dataclasses import dataclass, field
from typing import Any

import torch
from trl import GRPOTrainer

from rredcot import credit as C
from rredcot import segmentation as S
from rredcot.exit_scoring import (
    ExitStrings,
    TraceExits,
    TraceScores,
    completion_entropies,
    score_traces_naive,
)
from rredcot.grading import grade
from rredcot.prefix_scoring import ScoringBudget, score_traces_single_pass


@dataclass
class CreditConfig:
    """How the sequence advantage is spread over a completion's tokens."""

    method: str = "rredcot"
    """One of ``credit.CREDIT_METHODS``: ``uniform``, ``rredcot``, ``entropy``, ``rredcot+entropy``."""
    mix: float = 0.5
    """σ = (1-mix)/|o| + mix · (method's share); 0 gives uniform credit."""
    segmentation: S.SegmentationConfig = field(default_factory=S.SegmentationConfig)
    """Keyword/newline pieces, target number of segments, minimum length, homogenize."""
    exit_string: str = "</think>\n"
    """Text that closes the thinking block at an exit point."""
    answer_prefix: str = " \\boxed{"
    """Text between a reference solution and its answer."""
    answer_suffix: str = "}"
    """Text after the reference answer."""
    group_pairs: bool = False
    """Add the final solutions of the correct completions of the same group as reference pairs."""
    proposal: str = "uniform"
    """``uniform`` (q_i = 1/N) or ``given``: the dataset pair's log q from the ``reference_log_q`` column."""
    value_model: str = "policy"
    """``policy`` (the model that generated the batch) or ``reference`` (a frozen copy of the start)."""
    scorer: str = "single_pass"
    """``single_pass`` (shared prefix, tree mask) or ``naive`` (one sequence per exit point)."""
    budget: ScoringBudget = field(default_factory=ScoringBudget)
    """Memory bounds of the scoring passes."""
    view_every: int = 0
    """Keep credit records of a few traces every this many steps for inspection (0: never)."""
    view_samples: int = 2
    """Traces per kept step: the first with a positive and the first with a negative advantage, ..."""

    def __post_init__(self) -> None:
        C._check_method(self.method)
        choices = {
            "proposal": ("uniform", "given"),
            "value_model": ("policy", "reference"),
            "scorer": ("single_pass", "naive"),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.proposal == "given" and self.group_pairs:
            raise ValueError("proposal 'given' covers the dataset pair only; turn group_pairs off")
        if not 0.0 <= self.mix <= 1.0:
            raise ValueError(f"mix must lie in [0, 1], got {self.mix}")


@dataclass
class TraceCredit:
    """Credit computed for one completion (kept for logging and inspection)."""

    multiplier: torch.Tensor  # σ·|o| over the completion's tokens
    segment_starts: list[int] = field(default_factory=list)
    cuts: list[int] = field(default_factory=list)
    log_values: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    log_p_solution: torch.Tensor = field(default_factory=lambda: torch.empty(0))  # [n_cuts, N]
    log_p_answer: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    entropies: torch.Tensor = field(default_factory=lambda: torch.empty(0))


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
        self._token_text: dict[int, str] = {}
        self._encoded: dict[str, list[int]] = {}
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

    # -- helpers ---------------------------------------------------------------------------------
    def _encode(self, text: str) -> list[int]:
        if text not in self._encoded:
            self._encoded[text] = self.processing_class(text, add_special_tokens=False)["input_ids"]
        return self._encoded[text]

    def _token_texts(self, ids: list[int]) -> list[str]:
        missing = [t for t in set(ids) if t not in self._token_text]
        if missing:
            texts = self.processing_class.batch_decode([[t] for t in missing])
            self._token_text.update(zip(missing, texts, strict=True))
        return [self._token_text[t] for t in ids]

    def _strings(self) -> ExitStrings:
        cfg = self.credit
        return ExitStrings(
            self._encode(cfg.exit_string), self._encode(cfg.answer_prefix), self._encode(cfg.answer_suffix)
        )

    def _final_solution(self, text: str) -> tuple[str, str] | None:
        """(solution, answer) written after the last exit string of a completion, if well formed."""
        cfg = self.credit
        at = text.rfind(cfg.exit_string)
        if at < 0:
            return None
        rest = text[at + len(cfg.exit_string) :]
        a = rest.rfind(cfg.answer_prefix)
        b = rest.rfind(cfg.answer_suffix) if cfg.answer_suffix else len(rest)
        if a < 0 or b < a + len(cfg.answer_prefix):
            return None
        return rest[:a], rest[a + len(cfg.answer_prefix) : b]

    def _reference_pairs(
        self, inputs: list[dict[str, Any]], texts: list[str], i: int
    ) -> tuple[list[tuple[list[int], list[int]]], torch.Tensor | None, torch.Tensor]:
        """Reference pairs of row i: the dataset pair, then (optionally) correct group completions."""
        row = inputs[i]
        answer = str(row["answer"])
        pairs = [(row.get("reference") or "", answer)]
        if self.credit.group_pairs:
            for j, other in enumerate(inputs):
                if other["prompt"] == row["prompt"] and grade(texts[j], answer):
                    final = self._final_solution(texts[j])
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
        return [(self._encode(u) if u else [], self._encode(y)) for u, y in pairs], log_q, utility

    # -- credit ----------------------------------------------------------------------------------
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
        prompts = [prompt_ids[i][prompt_mask[i].bool()].tolist() for i in rows]
        completions = [completion_ids[i][: lengths[i]].tolist() for i in rows]
        texts = [""] * len(inputs)
        if self.credit.group_pairs and C.needs_exit_values(self.credit.method):
            every = [completion_ids[i][: lengths[i]].tolist() for i in range(len(inputs))]
            texts = self.processing_class.batch_decode(every, skip_special_tokens=True)
        policy = self.accelerator.unwrap_model(self.model)
        was_training = policy.training
        policy.eval()
        try:
            credits = self._compute_credit(inputs, texts, rows, prompts, completions, advantages, policy)
        finally:
            policy.train(was_training)
        stats = _CreditStats()
        for i, tc in zip(rows, credits, strict=True):
            per_token[i, : lengths[i]] = tc.multiplier.to(per_token.device)
            stats.add(tc)
        for name, value in stats.summary().items():
            self._metrics["train"][f"credit/{name}"].append(value)
        self._keep_views(inputs, rows, completions, advantages, credits)
        return per_token

    def _compute_credit(
        self,
        inputs: list[dict[str, Any]],
        texts: list[str],
        rows: list[int],
        prompts: list[list[int]],
        completions: list[list[int]],
        advantages: torch.Tensor,
        policy: torch.nn.Module,
    ) -> list[TraceCredit]:
        cfg = self.credit
        budget = cfg.budget
        if not C.needs_exit_values(cfg.method):  # entropy weighting: one forward pass, no scoring
            ents = completion_entropies(
                policy, list(zip(prompts, completions, strict=True)), budget.max_batch_tokens
            )
            return [
                TraceCredit(
                    C.credit_multiplier(cfg.method, len(c), float(advantages[i]), cfg.mix, entropies=h),
                    entropies=h,
                )
                for i, c, h in zip(rows, completions, ents, strict=True)
            ]

        eos = self.processing_class.eos_token_id
        starts: dict[int, list[int]] = {}

        def cuts_for(j: int, entropies: torch.Tensor) -> list[int]:
            completion = completions[j]
            found = S.segment_trace(self._token_texts(completion), entropies.tolist(), cfg.segmentation)
            # The final exit follows the whole trace but not its EOS: nothing is read after EOS, and
            # a segment never starts at the EOS (it joins the last segment), so cuts stay increasing.
            scored = len(completion) - 1 if completion[-1] == eos else len(completion)
            starts[j] = [s for s in found if s < scored] or [0]
            return [min(c, scored) for c in S.exit_cuts(starts[j], len(completion))]

        specs, extras = [], []
        for j, i in enumerate(rows):
            pairs, log_q, utility = self._reference_pairs(inputs, texts, i)
            specs.append(TraceExits(prompts[j], completions[j], None, pairs))
            extras.append((log_q, utility))
        value_model = self._value_model or policy
        if value_model is not policy:
            # Segment by the policy's entropies, score with the frozen value model.
            ents = completion_entropies(
                policy, [(s.prompt_ids, s.completion_ids) for s in specs], budget.max_batch_tokens
            )
            specs = [
                TraceExits(s.prompt_ids, s.completion_ids, cuts_for(j, ents[j]), s.pairs)
                for j, s in enumerate(specs)
            ]
        if cfg.scorer == "single_pass":
            scores = score_traces_single_pass(value_model, specs, self._strings(), budget, cuts_for)
        else:
            scores = score_traces_naive(
                value_model, specs, self._strings(), budget.max_batch_tokens, cuts_for
            )
        if value_model is not policy:
            scores = [
                TraceScores(sc.cuts, sc.log_p_solution, sc.log_p_answer, ents[j])
                for j, sc in enumerate(scores)
            ]
        return [
            self._trace_credit(len(completions[j]), starts[j], sc, float(advantages[i]), *extras[j])
            for j, (i, sc) in enumerate(zip(rows, scores, strict=True))
        ]

    def _trace_credit(
        self,
        n: int,
        starts: list[int],
        scores: TraceScores,
        advantage: float,
        log_q: torch.Tensor | None,
        utility: torch.Tensor,
    ) -> TraceCredit:
        log_v = C.exit_log_values(scores.log_p_solution, scores.log_p_answer, log_q, utility)
        rewards = C.segment_rewards(log_v)
        ids = S.segment_ids_from_starts(starts, n)
        ents = scores.entropies if self.credit.method == "rredcot+entropy" else None
        mult = C.credit_multiplier(self.credit.method, n, advantage, self.credit.mix, ids, rewards, ents)
        return TraceCredit(
            mult, starts, scores.cuts, log_v, scores.log_p_solution, scores.log_p_answer, scores.entropies
        )

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
                    tokens=self._token_texts(completions[j]),
                    credit=tc,
                    method=cfg.method,
                    step=step,
                    trace_id=f"step{step}-{j}",
                    prompt=str(inputs[i]["prompt"]),
                    answer=str(inputs[i]["answer"]),
                    advantage=float(advantages[i]),
                )
            )


def credit_record(
    tokens: list[str],
    credit: TraceCredit,
    method: str,
    step: int | None,
    trace_id: str,
    prompt: str,
    answer: str,
    advantage: float,
    reward: float | None = None,
) -> dict[str, Any]:
    """A JSON-ready description of one trace's credit (the input of ``rredcot.credit_view``)."""

    def finite(x: torch.Tensor) -> list[float | None]:
        return [float(v) if math.isfinite(float(v)) else None for v in x.flatten().tolist()]

    n = len(tokens)
    sigma = (credit.multiplier[:n].double() / max(n, 1)).tolist()
    first = (lambda t: -t[:, 0]) if credit.log_p_solution.dim() == 2 else (lambda t: t)
    return {
        "trace_id": trace_id,
        "step": step,
        "method": method,
        "prompt": prompt,
        "answer": answer,
        "reward": reward if reward is not None else float(advantage > 0),
        "advantage": advantage,
        "tokens": tokens,
        "sigma": sigma,
        "segment_starts": list(credit.segment_starts),
        "cuts": list(credit.cuts),
        "log_values": finite(credit.log_values),
        "thought_nll": finite(first(credit.log_p_solution)) if credit.log_p_solution.numel() else [],
        "answer_nll": finite(first(credit.log_p_answer)) if credit.log_p_answer.numel() else [],
        "entropies": [float(h) for h in credit.entropies.tolist()],
    }


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
