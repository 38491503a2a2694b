"""The policy's token entropies over completions (for segmentation and entropy weighting), and the
token it finds most likely at each position (for the greedy answer baseline's shortcut).

One forward per chunk of traces; the single-pass scorer reads the same quantities off its own trace
pass with :func:`completion_predictions_at`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from rredcot.method.forward import LogitHead, causal_states, model_device, pad_right, to_host
from rredcot.method.scoring.batching import distinct_traces, length_chunks, spans
from rredcot.method.scoring.types import ScoringBudget


def completion_entropies(
    model: torch.nn.Module,
    traces: Sequence[tuple[Sequence[int], Sequence[int]]],
    budget: ScoringBudget | None = None,
) -> list[Tensor]:
    """Token entropies (bits) of each (prompt_ids, completion_ids) under the model: batched forward passes.

    Position ``P + j - 1`` predicts completion token j; with an empty prompt the first token has no
    predicting position and gets the mean entropy of the others (as in ``single_pass``).
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
