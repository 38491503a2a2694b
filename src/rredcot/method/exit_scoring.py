"""Teacher-forced scoring of exit points with a causal LM (docs/METHOD-NOTES.md, note 6).

For a cut ``c`` in the completion the scored sequence is::

    prompt ⊕ completion[:c] ⊕ exit ⊕ solution ⊕ answer_prefix ⊕ answer ⊕ answer_suffix

and we read off ``log p(u|s)`` (sum of token log-probs over the solution span) and ``log p(y|u,s)``
(sum over the answer span, delimiters excluded). This module holds the shared types and the naive
scorer: one full sequence per (cut, reference pair), right-padded and batched under a token budget,
≈ K·L/2 tokens for K cuts of a trace of L tokens. ``prefix_scoring.py`` is the single-pass scorer
(≈ L + K·A tokens) that the trainer uses; the naive one is the reference it is tested against.
The model is any HF causal LM; it is called through ``rredcot.method.forward`` (decoder, then the LM head
only at scored positions); its training/eval mode is left as the caller set it (callers put it in
eval mode).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from rredcot.method.forward import (
    decoder_states,
    entropies_and_argmax,
    model_device,
    token_log_probs,
)

__all__ = ["model_device"]  # re-exported: callers of this module's scorers also place inputs


@dataclass(frozen=True)
class ScoringBudget:
    """Bounds on the work of one forward pass of the credit passes, so that long traces fit.

    Every pass (trace pass, suffix pass, greedy-baseline prefill and decoding, entropies, naive
    scoring) keeps to all three; a single sequence longer than ``max_batch_tokens`` gets a pass of
    its own. docs/DISTRIBUTED.md turns them into GPU memory for the paper's models.
    """

    max_batch_tokens: int = 32768
    """Tokens one forward pass holds: rows x longest row, counting the cached keys a row attends to
    (trace pass: rows x trace length; suffix pass: rows x (cached prefix + packed suffixes); greedy
    baseline: rows x (head + decoded + forced tokens))."""
    max_mask_elements: int = 1 << 26
    """Entries of one 4D attention mask (rows x queries x keys) of the suffix pass."""
    max_logit_elements: int = 1 << 25
    """Vocabulary logits materialised at once (positions x vocabulary size), in float32."""

    def __post_init__(self) -> None:
        for name in ("max_batch_tokens", "max_mask_elements", "max_logit_elements"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")


@dataclass(frozen=True)
class ExitScores:
    """Per-exit-point teacher-forced log-probabilities (float32, shape [n_cuts])."""

    log_p_solution: Tensor  # log p(u | s): minus the "thought NLL"
    log_p_answer: Tensor  # log p(y | u, s): minus the "reference answer NLL"


@dataclass(frozen=True)
class Job:
    """One sequence to score and where its solution and answer spans lie."""

    ids: list[int]
    solution_start: int
    solution_len: int
    answer_start: int
    answer_len: int


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


# A chunk of traces is right-padded to its longest; a trace shorter than this fraction of it starts
# a new chunk (see ``length_chunks``).
LENGTH_BAND = 0.75


def length_chunks(
    lengths: Sequence[int], max_batch_tokens: int, band: float = LENGTH_BAND
) -> list[list[int]]:
    """Indices of sequences grouped for batched passes, longest first, each within ``max_batch_tokens``.

    A sequence shorter than ``band`` times its chunk's longest starts a new chunk: padding then stays
    under a quarter of any row, and one more (short) pass costs less than the padding on sampled
    completions of uneven length. ``band=0`` packs by the budget alone (for loops whose cost is per
    call rather than per token). A sequence longer than the budget gets a pass of its own.
    """
    chunks: list[list[int]] = []
    widest = 0
    for i in sorted(range(len(lengths)), key=lambda j: lengths[j], reverse=True):
        n = lengths[i]
        fits = chunks and (len(chunks[-1]) + 1) * widest <= max_batch_tokens
        if fits and n >= band * widest:
            chunks[-1].append(i)
        else:
            chunks.append([i])
            widest = n
    return chunks


def distinct_traces(traces: Sequence[tuple[Sequence[int], Sequence[int]]]) -> dict[int, list[int]]:
    """First index of each distinct (prompt_ids, completion_ids) → every index holding the same trace.

    Sampled groups repeat completions; a repeated trace is read once.
    """
    members: dict[int, list[int]] = {}
    first: dict[tuple, int] = {}
    for i, (prompt, completion) in enumerate(traces):
        members.setdefault(first.setdefault((tuple(prompt), tuple(completion)), i), []).append(i)
    return members


def make_jobs(
    prompt_ids: Sequence[int],
    completion_ids: Sequence[int],
    cuts: Sequence[int],
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
    exit_ids: Sequence[int],
    answer_prefix_ids: Sequence[int],
    answer_suffix_ids: Sequence[int],
) -> list[Job]:
    """Jobs in cut-major order: job ``i * len(pairs) + j`` is cut i with reference pair j."""
    jobs = []
    for cut in cuts:
        if not 0 <= cut <= len(completion_ids):
            raise ValueError(f"cut {cut} outside [0, {len(completion_ids)}]")
        head = [*prompt_ids, *completion_ids[:cut], *exit_ids]
        # The first solution token needs a preceding position whose logits predict it.
        if not head:
            raise ValueError("prompt, completion prefix and exit string are all empty")
        for solution_ids, answer_ids in pairs:
            solution_start = len(head)
            answer_start = solution_start + len(solution_ids) + len(answer_prefix_ids)
            ids = [*head, *solution_ids, *answer_prefix_ids, *answer_ids, *answer_suffix_ids]
            jobs.append(Job(ids, solution_start, len(solution_ids), answer_start, len(answer_ids)))
    return jobs


def chunk_jobs(jobs: list[Job], max_batch_tokens: int) -> list[list[int]]:
    """Group job indices so that each chunk's padded size (rows × longest row) fits the budget.

    Jobs are taken longest first so that rows of similar length share a chunk and little padding
    is wasted; a single job longer than the budget runs on its own.
    """
    order = sorted(range(len(jobs)), key=lambda i: len(jobs[i].ids), reverse=True)
    chunks: list[list[int]] = []
    for i in order:
        # The first row of a chunk is its longest, so its length bounds every row's padded length.
        if chunks and (len(chunks[-1]) + 1) * len(jobs[chunks[-1][0]].ids) <= max_batch_tokens:
            chunks[-1].append(i)
        else:
            chunks.append([i])
    return chunks


def score_jobs(
    model: torch.nn.Module,
    jobs: list[Job],
    max_batch_tokens: int,
    max_logit_elements: int = ScoringBudget.max_logit_elements,
) -> tuple[Tensor, Tensor]:
    """Score every job; returns (log_p_solution, log_p_answer), float32 on the CPU, in job order.

    Logits are computed only at the positions that predict a solution or answer token.
    """
    if max_batch_tokens < 1:
        raise ValueError("max_batch_tokens must be positive")
    device = model_device(model)
    log_p_solution = torch.zeros(len(jobs), dtype=torch.float64)
    log_p_answer = torch.zeros(len(jobs), dtype=torch.float64)
    with torch.inference_mode():
        for chunk in chunk_jobs(jobs, max_batch_tokens):
            rows = [jobs[i] for i in chunk]
            width = max(len(job.ids) for job in rows)
            # Right padding keeps the default positions 0..len-1 of every real token correct; pad
            # tokens are masked out and, the model being causal, never influence real positions.
            input_ids = torch.zeros(len(rows), width, dtype=torch.long)
            attention_mask = torch.zeros(len(rows), width, dtype=torch.long)
            for b, job in enumerate(rows):
                input_ids[b, : len(job.ids)] = torch.tensor(job.ids, dtype=torch.long)
                attention_mask[b, : len(job.ids)] = 1
            hidden, _ = decoder_states(model, input_ids.to(device), attention_mask.to(device))
            # (row, target position, output index, is answer) of every scored token.
            picks = [
                (b, pos, i, is_answer)
                for b, (i, job) in enumerate(zip(chunk, rows, strict=True))
                for start, length, is_answer in (
                    (job.solution_start, job.solution_len, False),
                    (job.answer_start, job.answer_len, True),
                )
                for pos in range(start, start + length)
            ]
            if not picks:
                continue
            pick = torch.tensor(picks)
            rows_at, pos = pick[:, 0].to(device), pick[:, 1].to(device)
            # Position t predicts token t + 1.
            log_p = token_log_probs(
                model, hidden[rows_at, pos - 1], input_ids.to(device)[rows_at, pos], max_logit_elements
            )
            log_p = log_p.double().cpu()
            answer = pick[:, 3].bool()
            log_p_solution.index_add_(0, pick[~answer, 2], log_p[~answer])
            log_p_answer.index_add_(0, pick[answer, 2], log_p[answer])
    return log_p_solution.float(), log_p_answer.float()


def score_exit_points(
    model: torch.nn.Module,
    prompt_ids: list[int],
    completion_ids: list[int],
    cuts: list[int],
    solution_ids: list[int],
    answer_ids: list[int],
    exit_ids: list[int],
    answer_prefix_ids: list[int],
    answer_suffix_ids: list[int],
    max_batch_tokens: int = 32768,
) -> ExitScores:
    """Teacher-forced ``log p(u|s)`` and ``log p(y|u,s)`` of one reference pair at every cut.

    Returns float32 CPU tensors of shape [len(cuts)]. ``max_batch_tokens`` bounds the padded token
    count of one forward pass; logits are computed only where a scored token is predicted.
    """
    pairs = [(solution_ids, answer_ids)]
    jobs = make_jobs(prompt_ids, completion_ids, cuts, pairs, exit_ids, answer_prefix_ids, answer_suffix_ids)
    log_p_solution, log_p_answer = score_jobs(model, jobs, max_batch_tokens)
    return ExitScores(log_p_solution, log_p_answer)


def score_reference_pairs(
    model: torch.nn.Module,
    prompt_ids: list[int],
    completion_ids: list[int],
    cuts: list[int],
    pairs: list[tuple[list[int], list[int]]],
    exit_ids: list[int],
    answer_prefix_ids: list[int],
    answer_suffix_ids: list[int],
    max_batch_tokens: int = 32768,
) -> tuple[Tensor, Tensor]:
    """Like ``score_exit_points`` for N (solution_ids, answer_ids) pairs at once.

    Returns ``(log_p_solution, log_p_answer)``, float32 of shape [len(cuts), N], ready for
    ``credit.pr_log_value``. All (cut, pair) sequences share the batching budget.
    """
    if not pairs:
        raise ValueError("need at least one reference pair")
    jobs = make_jobs(prompt_ids, completion_ids, cuts, pairs, exit_ids, answer_prefix_ids, answer_suffix_ids)
    log_p_solution, log_p_answer = score_jobs(model, jobs, max_batch_tokens)
    shape = (len(cuts), len(pairs))
    return log_p_solution.view(shape), log_p_answer.view(shape)


def completion_entropies(
    model: torch.nn.Module,
    traces: Sequence[tuple[Sequence[int], Sequence[int]]],
    budget: ScoringBudget | None = None,
) -> list[Tensor]:
    """Token entropies (bits) of each (prompt_ids, completion_ids) under the model: batched forward passes.

    Position ``P + j - 1`` predicts completion token j; with an empty prompt the first token has no
    predicting position and gets the mean entropy of the others (as in ``prefix_scoring``).
    """
    return [h for h, _ in completion_predictions(model, traces, budget)]


def completion_predictions(
    model: torch.nn.Module,
    traces: Sequence[tuple[Sequence[int], Sequence[int]]],
    budget: ScoringBudget | None = None,
) -> list[tuple[Tensor, Tensor]]:
    """Per trace: ``completion_entropies`` and the most likely token at each completion position
    (long, -1 for a first token that no position predicts). Passes keep to ``budget``."""
    budget = budget or ScoringBudget()
    device = model_device(model)
    out: list[tuple[Tensor, Tensor]] = [(torch.zeros(0), torch.zeros(0, dtype=torch.long))] * len(traces)
    members = distinct_traces(traces)
    reps = list(members)
    seqs = {i: [*traces[i][0], *traces[i][1]] for i in reps}

    def flush(rows: list[int]) -> None:
        width = max(len(seqs[i]) for i in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for b, i in enumerate(rows):
            ids[b, : len(seqs[i])] = torch.tensor(seqs[i], dtype=torch.long)
            mask[b, : len(seqs[i])] = 1
        hidden, _ = decoder_states(model, ids.to(device), mask.to(device))
        for b, i in enumerate(rows):
            h, g = completion_entropies_at(model, hidden[b], len(traces[i][0]), len(traces[i][1]), budget)
            for j in members[i]:
                out[j] = (h, g)

    with torch.inference_mode():
        for chunk in length_chunks([len(seqs[i]) for i in reps], budget.max_batch_tokens):
            flush([reps[j] for j in chunk])
    return out


def completion_entropies_at(
    model: torch.nn.Module, hidden: Tensor, prompt_len: int, completion_len: int, budget: ScoringBudget
) -> tuple[Tensor, Tensor]:
    """Entropies (bits) and argmax tokens of a completion from one row's hidden states [T, d].

    Position ``p + j - 1`` predicts completion token j. With an empty prompt the first token has no
    predicting position: it gets the mean entropy of the others and argmax -1.
    """
    p, n = prompt_len, completion_len
    if n == 0:
        return torch.zeros(0), torch.zeros(0, dtype=torch.long)
    if p == 0:
        h, g = entropies_and_argmax(model, hidden[: n - 1], budget.max_logit_elements)
        first = h.mean() if h.numel() else torch.tensor(0.0)
        return torch.cat([first.reshape(1), h]), torch.cat([torch.full((1,), -1), g])
    return entropies_and_argmax(model, hidden[p - 1 : p + n - 1], budget.max_logit_elements)


def score_traces_naive(
    model: torch.nn.Module,
    traces: Sequence[TraceExits],
    strings: ExitStrings,
    budget: ScoringBudget | None = None,
    cuts_for: Callable[[int, Tensor], Sequence[int]] | None = None,
) -> list[TraceScores]:
    """Naive exit-point scores of many traces; same contract as ``prefix_scoring.score_traces_single_pass``.

    All (trace, cut, pair) sequences share the batching budget. Entropies come from an extra forward
    pass over the traces. Works for any causal LM: no cache, no 4D mask (the fallback for models whose
    cache the single-pass scorer cannot cut, such as hybrid linear-attention models).
    """
    budget = budget or ScoringBudget()
    predictions = completion_predictions(model, [(t.prompt_ids, t.completion_ids) for t in traces], budget)
    entropies = [h for h, _ in predictions]
    jobs: list[Job] = []
    bounds = []
    for i, t in enumerate(traces):
        cuts = t.cuts
        if cuts is None:
            if cuts_for is None:
                raise ValueError(f"trace {i} has no cuts and no cuts_for was given")
            cuts = cuts_for(i, entropies[i])
        cuts = [int(c) for c in cuts]
        start = len(jobs)
        jobs += make_jobs(
            t.prompt_ids,
            t.completion_ids,
            cuts,
            t.pairs,
            strings.exit_ids,
            strings.answer_prefix_ids,
            strings.answer_suffix_ids,
        )
        bounds.append((start, len(jobs), cuts))
    own: dict[int, int] = {}  # trace -> job index of its own-answer sequence
    for i, t in enumerate(traces):
        if t.answer_cut is not None:
            own[i] = len(jobs)
            jobs += make_jobs(
                t.prompt_ids,
                t.completion_ids,
                [t.answer_cut],
                [([], t.pairs[0][1])],
                [],
                strings.answer_prefix_ids,
                strings.answer_suffix_ids,
            )
    log_p_solution, log_p_answer = score_jobs(model, jobs, budget.max_batch_tokens, budget.max_logit_elements)
    results = []
    for i, ((a, b, cuts), t, (ent, greedy)) in enumerate(zip(bounds, traces, predictions, strict=True)):
        shape = (len(cuts), len(t.pairs))
        own_answer = log_p_answer[own[i]] if i in own else None
        sol, ans = log_p_solution[a:b].view(shape), log_p_answer[a:b].view(shape)
        results.append(TraceScores(cuts, sol, ans, ent, own_answer, greedy))
    return results
