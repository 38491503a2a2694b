"""What the exit-point scorers take and give, and the memory bounds of their passes.

A trace to score (:class:`TraceExits`: prompt, completion, exit points, reference pairs), the fixed
texts around a reference pair at an exit (:class:`ExitStrings`), the scores of one trace
(:class:`TraceScores`) and :class:`ScoringBudget`, which every credit pass keeps to.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class ScoringBudget:
    """Bounds on the work of one forward pass of the credit passes, so that long traces fit.

    Every pass (trace pass, suffix pass, greedy-baseline prefill and decoding, entropies, naive
    scoring) keeps to all three; a single sequence longer than ``max_batch_tokens`` gets a pass of
    its own. docs/distributed.md, "Memory", turns them into GPU memory for the paper's models.
    """

    max_batch_tokens: int = 32768
    """Tokens one forward pass holds: rows x longest row, counting the cached keys a row attends to
    (trace pass: rows x trace length; suffix pass: rows x (cached prefix + packed suffixes); greedy
    baseline: rows x (head + decoded + forced tokens))."""
    max_mask_elements: int = 1 << 26
    """Entries of one 4D attention mask (rows x queries x keys) of the suffix pass."""
    max_logit_elements: int | None = None
    """Vocabulary logits materialised at once (positions x vocabulary size), in float32; null: they
    follow the free memory on a GPU (a quarter of it, so a pass reads hundreds of thousands of
    positions in a few chunks) and are 2^25 on a CPU."""

    def __post_init__(self) -> None:
        for name in ("max_batch_tokens", "max_mask_elements", "max_logit_elements"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be positive")


@dataclass(frozen=True)
class ExitScores:
    """Per-exit-point teacher-forced log-probabilities (float32, shape [n_cuts])."""

    log_p_solution: Tensor  # log p(u | s): minus the "thought NLL"
    log_p_answer: Tensor  # log p(y | u, s): minus the "reference answer NLL"


@dataclass(frozen=True)
class ExitStrings:
    """Token ids of the fixed texts around the reference pair at every exit point."""

    exit_ids: list[int]  # closes the thinking block
    answer_prefix_ids: list[int]  # between solution and answer, e.g. " \\boxed{"
    answer_suffix_ids: list[int]  # after the answer, e.g. "}"


@dataclass(frozen=True)
class TraceExits:
    """One trace to score: its prompt, completion, exit points and N reference pairs.

    ``cuts`` may be None when the scorer chooses them from the trace's entropies (``cuts_for``).
    ``answer_cut``, when given, also scores the first pair's answer right after the model's own
    solution: ``prompt ⊕ completion[:answer_cut] ⊕ answer_prefix ⊕ answer ⊕ answer_suffix`` (no exit
    string, no reference solution), giving ``TraceScores.log_p_own_answer``.
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    cuts: list[int] | None
    pairs: list[tuple[list[int], list[int]]]  # (solution_ids, answer_ids)
    answer_cut: int | None = None

    def __post_init__(self) -> None:
        if not self.pairs:
            raise ValueError("need at least one reference pair")


@dataclass(frozen=True)
class TraceScores:
    """Exit-point scores of one trace: float32 [n_cuts, n_pairs] and the completion's entropies (bits)."""

    cuts: list[int]
    log_p_solution: Tensor  # log p(u|s): minus the thought NLL
    log_p_answer: Tensor  # log p(y|u,s): minus the reference answer NLL
    entropies: Tensor  # [completion length], float32
    log_p_own_answer: Tensor | None = None  # log p(y_1 | own solution, s): scalar, with answer_cut
    # The token the model finds most likely at each completion position (long; -1 where no position
    # predicts it): where the completion follows it, greedy decoding would have written the same.
    greedy_ids: Tensor | None = None
