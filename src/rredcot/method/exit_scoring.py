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

from rredcot.method.forward import LogitHead, causal_states, model_device, pad_right, to_host

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


def spans(starts: Sequence[int], lengths: Sequence[int]) -> Tensor:
    """The indices ``start, start + 1, ..., start + length - 1`` of every span, concatenated (long).

    Built with tensor operations, not a loop over tokens: the passes index thousands of positions."""
    length = torch.as_tensor(lengths, dtype=torch.long)
    start = torch.as_tensor(starts, dtype=torch.long)
    total = int(length.sum()) if length.numel() else 0
    if total == 0:
        return torch.zeros(0, dtype=torch.long)
    first = torch.cumsum(length, 0) - length  # where each span begins in the output
    which = torch.repeat_interleave(torch.arange(length.numel()), length, output_size=total)
    return start[which] + torch.arange(total) - first[which]


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
    (long, -1 for a first token that no position predicts). Passes keep to ``budget``; the results
    reach the host once, after the last pass."""
    budget = budget or ScoringBudget()
    device = model_device(model)
    members = distinct_traces(traces)
    reps = list(members)
    seqs = {i: [*traces[i][0], *traces[i][1]] for i in reps}
    parts: list[tuple[list[int], Tensor, Tensor]] = []

    with torch.inference_mode():
        head = LogitHead(model, budget.max_logit_elements)
        for chunk in length_chunks([len(seqs[i]) for i in reps], budget.max_batch_tokens):
            rows = [reps[j] for j in chunk]
            ids = pad_right([seqs[i] for i in rows])
            hidden = causal_states(model, ids.to(device, non_blocking=True))
            lengths = [(len(traces[i][0]), len(traces[i][1])) for i in rows]
            entropies, best = completion_predictions_at(head, hidden, lengths)
            parts.append((rows, entropies, best))
    moved = to_host(*(t for _, entropies, best in parts for t in (entropies, best)))
    out: list[tuple[Tensor, Tensor]] = [(torch.zeros(0), torch.zeros(0, dtype=torch.long))] * len(traces)
    for k, (rows, _, _) in enumerate(parts):
        lengths = [(len(traces[i][0]), len(traces[i][1])) for i in rows]
        predictions = split_predictions(moved[2 * k], moved[2 * k + 1], lengths)
        for i, prediction in zip(rows, predictions, strict=True):
            for j in members[i]:
                out[j] = prediction
    return out


def completion_predictions_at(
    head: LogitHead, hidden: Tensor, lengths: Sequence[tuple[int, int]]
) -> tuple[Tensor, Tensor]:
    """Entropies (bits) and argmax tokens of the completions of a right-padded batch, concatenated, on
    the device: row b's prompt and completion lengths are ``lengths[b]``, its hidden states
    ``hidden[b]`` [T, d]. Position ``p + j - 1`` predicts completion token j; a first token with no
    predicting position (empty prompt) is left out (``split_predictions`` fills it in)."""
    width = hidden.shape[1]
    starts = [b * width + max(p - 1, 0) for b, (p, _) in enumerate(lengths)]
    counts = [n - (p == 0 and n > 0) for p, n in lengths]
    at = spans(starts, counts).to(hidden.device, non_blocking=True)
    return head.entropies_and_argmax(hidden.flatten(0, 1)[at])


def split_predictions(
    entropies: Tensor, best: Tensor, lengths: Sequence[tuple[int, int]]
) -> list[tuple[Tensor, Tensor]]:
    """Per row, the (entropies, argmax) that ``completion_predictions_at`` concatenated. With an empty
    prompt the first token gets the mean entropy of the others and argmax -1."""
    counts = [n - (p == 0 and n > 0) for p, n in lengths]
    out = []
    for (p, n), h, g in zip(lengths, entropies.split(counts), best.split(counts), strict=True):
        if p == 0 and n > 0:
            first = h.mean() if h.numel() else torch.tensor(0.0)
            h, g = torch.cat([first.reshape(1), h]), torch.cat([torch.full((1,), -1), g])
        out.append((h, g))
    return out


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
