"""The naive exit-point scorer: one sequence per (exit point, reference pair), the reference the
single-pass scorer is tested against (docs/method.md, "Single-pass scoring").

For a cut ``c`` in the completion the scored sequence is::

    prompt ⊕ completion[:c] ⊕ exit ⊕ solution ⊕ answer_prefix ⊕ answer ⊕ answer_suffix

and we read off ``log p(u|s)`` (sum of token log-probs over the solution span) and ``log p(y|u,s)``
(sum over the answer span, delimiters excluded). Sequences are right-padded and batched under a
token budget, about K·L/2 tokens for K cuts of a trace of L tokens (``single_pass.py``: about
L + K·A). It works for any causal LM (no cache, no 4D mask): the fallback for models whose cache the
single-pass scorer cannot cut, such as hybrid linear-attention models. The model is called through
``rredcot.method.forward`` (decoder, then the LM head only at scored positions); its training/eval
mode is left as the caller set it (callers put it in eval mode).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from rredcot.method.forward import LogitHead, causal_states, model_device, pad_right, to_host
from rredcot.method.scoring.batching import spans
from rredcot.method.scoring.entropies import completion_predictions
from rredcot.method.scoring.types import ExitScores, ExitStrings, ScoringBudget, TraceExits, TraceScores


@dataclass(frozen=True)
class Job:
    """One sequence to score and where its solution and answer spans lie."""

    ids: list[int]
    solution_start: int
    solution_len: int
    answer_start: int
    answer_len: int


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
    max_logit_elements: int | None = ScoringBudget.max_logit_elements,
) -> tuple[Tensor, Tensor]:
    """Score every job; returns (log_p_solution, log_p_answer), float32 on the CPU, in job order.

    Logits are computed only at the positions that predict a solution or answer token; sums stay on
    the device until every chunk is scored.
    """
    if max_batch_tokens < 1:
        raise ValueError("max_batch_tokens must be positive")
    device = model_device(model)
    sums = torch.zeros(2 * len(jobs), dtype=torch.float64, device=device)  # [solution | answer]
    with torch.inference_mode():
        head = LogitHead(model, max_logit_elements)
        for chunk in chunk_jobs(jobs, max_batch_tokens):
            rows = [jobs[i] for i in chunk]
            input_ids = pad_right([job.ids for job in rows])
            width = input_ids.shape[1]
            # Every scored token: its flat position b * width + t and the output slot it adds to.
            starts, lengths, slots = [], [], []
            for b, (i, job) in enumerate(zip(chunk, rows, strict=True)):
                for start, length, offset in (
                    (job.solution_start, job.solution_len, 0),
                    (job.answer_start, job.answer_len, len(jobs)),
                ):
                    starts.append(b * width + start)
                    lengths.append(length)
                    slots.append(i + offset)
            at = spans(starts, lengths)
            if at.numel() == 0:
                continue
            dest = torch.repeat_interleave(torch.tensor(slots), torch.tensor(lengths), output_size=at.numel())
            input_ids = input_ids.to(device, non_blocking=True)
            hidden = causal_states(model, input_ids)
            at = at.to(device, non_blocking=True)
            # Position t predicts token t + 1.
            log_p = head.token_log_probs(hidden.flatten(0, 1)[at - 1], input_ids.flatten()[at])
            sums.index_add_(0, dest.to(device, non_blocking=True), log_p.double())
    (sums,) = to_host(sums)
    return sums[: len(jobs)].float(), sums[len(jobs) :].float()


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


def score_traces_naive(
    model: torch.nn.Module,
    traces: Sequence[TraceExits],
    strings: ExitStrings,
    budget: ScoringBudget | None = None,
    cuts_for: Callable[[int, Tensor], Sequence[int]] | None = None,
) -> list[TraceScores]:
    """Naive exit-point scores of many traces; same contract as ``single_pass.score_traces_single_pass``.

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
