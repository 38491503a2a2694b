"""How the credit passes group their rows: by length under a token budget, each distinct trace once,
and spans of positions as index tensors."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

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
