"""Teacher-forced scoring of exit points with a causal LM (METHOD.md section 2.3).

For a cut ``c`` in the completion the scored sequence is::

    prompt ⊕ completion[:c] ⊕ exit ⊕ solution ⊕ answer_prefix ⊕ answer ⊕ answer_suffix

and we read off ``log p(u|s)`` (sum of token log-probs over the solution span) and ``log p(y|u,s)``
(sum over the answer span, delimiters excluded). This is the naive version: one full sequence per
(cut, reference pair), right-padded and batched under a token budget. The model is any HF-style
causal LM called as ``model(input_ids=..., attention_mask=..., use_cache=False).logits``; its
training/eval mode is left as the caller set it (callers put it in eval mode).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class ExitScores:
    """Per-exit-point teacher-forced log-probabilities (float32, shape [n_cuts])."""

    log_p_solution: Tensor  # log p(u | s): minus the "thought NLL"
    log_p_answer: Tensor  # log p(y | u, s): minus the "reference answer NLL"


@dataclass(frozen=True)
class _Job:
    """One sequence to score and where its solution and answer spans lie."""

    ids: list[int]
    solution_start: int
    solution_len: int
    answer_start: int
    answer_len: int


def _model_device(model: torch.nn.Module) -> torch.device:
    device = getattr(model, "device", None)
    if isinstance(device, torch.device):
        return device
    return next(model.parameters()).device


def _make_jobs(
    prompt_ids: Sequence[int],
    completion_ids: Sequence[int],
    cuts: Sequence[int],
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
    exit_ids: Sequence[int],
    answer_prefix_ids: Sequence[int],
    answer_suffix_ids: Sequence[int],
) -> list[_Job]:
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
            jobs.append(_Job(ids, solution_start, len(solution_ids), answer_start, len(answer_ids)))
    return jobs


def _chunks(jobs: list[_Job], max_batch_tokens: int) -> list[list[int]]:
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


def _span_log_probs(logits: Tensor, input_ids: Tensor, starts: Tensor, lengths: Tensor) -> Tensor:
    """Sum of log p(input_ids[b, starts_b + j]) over j < lengths_b, for each row b (float32).

    Spans may differ in length between rows (different reference pairs): they are padded to the
    longest and the surplus positions masked out.
    """
    width = int(lengths.max()) if lengths.numel() else 0
    if width == 0:
        return torch.zeros(logits.shape[0], dtype=torch.float32, device=logits.device)
    offsets = torch.arange(width, device=logits.device)[None, :]
    valid = offsets < lengths[:, None]
    # Masked positions point at the span start, a valid position, and are zeroed after gathering.
    targets = starts[:, None] + torch.where(valid, offsets, 0)  # [B, width]
    # Only the predicting rows go through log_softmax: the full [B, T, V] in float32 would be huge.
    rows = logits.gather(1, (targets - 1)[..., None].expand(-1, -1, logits.shape[-1])).float()
    log_p = torch.log_softmax(rows, dim=-1)
    token_log_p = log_p.gather(-1, input_ids.gather(1, targets)[..., None]).squeeze(-1)
    return torch.where(valid, token_log_p, 0.0).sum(dim=-1)


def _score_jobs(model: torch.nn.Module, jobs: list[_Job], max_batch_tokens: int) -> tuple[Tensor, Tensor]:
    """Score every job; returns (log_p_solution, log_p_answer), float32 on the CPU, in job order."""
    if max_batch_tokens < 1:
        raise ValueError("max_batch_tokens must be positive")
    device = _model_device(model)
    log_p_solution = torch.zeros(len(jobs), dtype=torch.float32)
    log_p_answer = torch.zeros(len(jobs), dtype=torch.float32)
    with torch.inference_mode():
        for chunk in _chunks(jobs, max_batch_tokens):
            rows = [jobs[i] for i in chunk]
            width = max(len(job.ids) for job in rows)
            # Right padding keeps the default positions 0..len-1 of every real token correct; pad
            # tokens are masked out and, the model being causal, never influence real positions.
            input_ids = torch.zeros(len(rows), width, dtype=torch.long)
            attention_mask = torch.zeros(len(rows), width, dtype=torch.long)
            for b, job in enumerate(rows):
                input_ids[b, : len(job.ids)] = torch.tensor(job.ids, dtype=torch.long)
                attention_mask[b, : len(job.ids)] = 1
            input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
            logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
            spans = torch.tensor(
                [[job.solution_start, job.solution_len, job.answer_start, job.answer_len] for job in rows],
                device=device,
            )
            sol = _span_log_probs(logits, input_ids, spans[:, 0], spans[:, 1])
            ans = _span_log_probs(logits, input_ids, spans[:, 2], spans[:, 3])
            idx = torch.tensor(chunk)
            log_p_solution[idx] = sol.cpu()
            log_p_answer[idx] = ans.cpu()
    return log_p_solution, log_p_answer


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
    count of one forward pass (the model still materialises logits for every position, so scale it
    down for large vocabularies).
    """
    pairs = [(solution_ids, answer_ids)]
    jobs = _make_jobs(prompt_ids, completion_ids, cuts, pairs, exit_ids, answer_prefix_ids, answer_suffix_ids)
    log_p_solution, log_p_answer = _score_jobs(model, jobs, max_batch_tokens)
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
    jobs = _make_jobs(prompt_ids, completion_ids, cuts, pairs, exit_ids, answer_prefix_ids, answer_suffix_ids)
    log_p_solution, log_p_answer = _score_jobs(model, jobs, max_batch_tokens)
    shape = (len(cuts), len(pairs))
    return log_p_solution.view(shape), log_p_answer.view(shape)


@dataclass(frozen=True)
class TraceExits:
    """One trace's exit points and reference pair, for scoring many traces in shared batches."""

    prompt_ids: list[int]
    completion_ids: list[int]
    cuts: list[int]
    solution_ids: list[int]
    answer_ids: list[int]


def score_traces(
    model: torch.nn.Module,
    traces: Sequence[TraceExits],
    exit_ids: list[int],
    answer_prefix_ids: list[int],
    answer_suffix_ids: list[int],
    max_batch_tokens: int = 32768,
) -> list[ExitScores]:
    """``score_exit_points`` for many traces at once: all their sequences share the batching budget.

    A trainer scores the whole generation batch with this, so the forward passes are few and full
    instead of one small batch per trace.
    """
    jobs: list[_Job] = []
    bounds = []
    for t in traces:
        start = len(jobs)
        jobs += _make_jobs(
            t.prompt_ids,
            t.completion_ids,
            t.cuts,
            [(t.solution_ids, t.answer_ids)],
            exit_ids,
            answer_prefix_ids,
            answer_suffix_ids,
        )
        bounds.append((start, len(jobs)))
    log_p_solution, log_p_answer = _score_jobs(model, jobs, max_batch_tokens)
    return [ExitScores(log_p_solution[a:b], log_p_answer[a:b]) for a, b in bounds]
