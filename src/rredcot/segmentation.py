"""Hybrid keyword-entropy segmentation of a trace (METHOD.md section 3).

    token texts --piece_starts--> pieces (cut at newlines and sentence-initial keywords)
    pieces + token entropies --merge_pieces--> K segments (lowest-entropy neighbours merged first)

Segments are described by their start token indices ``[0, b_1, …, b_{K-1}]``; ``exit_cuts`` turns them
into the K+1 exit points scored by ``rredcot.exit_scoring`` (see ``rredcot.credit`` for the
convention).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

DEFAULT_KEYWORDS: tuple[str, ...] = (
    "Wait",
    "But",
    "Alternatively",
    "Hmm",
    "So",
    "Let me",
    "Now",
    "Therefore",
    "Thus",
    "Okay",
    "First",
    "Next",
    "Finally",
    "Check",
)


def merge_pieces(piece_entropies: Sequence[float] | Tensor, n_segments: int) -> list[list[int]]:
    """Greedily merge adjacent pieces until ``n_segments`` groups remain.

    Each step merges the adjacent pair of groups whose summed entropy is lowest (ties go to the
    leftmost pair), so predictable low-entropy text is lumped together and the exit-point budget is
    spent where the model was uncertain. Returns groups of consecutive piece indices, in order,
    covering every piece; with no more pieces than ``n_segments`` every piece is its own group.
    """
    if n_segments < 1:
        raise ValueError(f"n_segments must be >= 1, got {n_segments}")
    if isinstance(piece_entropies, Tensor):
        piece_entropies = piece_entropies.detach().double().cpu().tolist()
    groups = [[i] for i in range(len(piece_entropies))]
    sums = [float(h) for h in piece_entropies]
    while len(groups) > n_segments:
        # Strict '<' keeps the leftmost pair on ties.
        best = 0
        best_sum = sums[0] + sums[1]
        for i in range(1, len(groups) - 1):
            pair_sum = sums[i] + sums[i + 1]
            if pair_sum < best_sum:
                best, best_sum = i, pair_sum
        groups[best : best + 2] = [groups[best] + groups[best + 1]]
        sums[best : best + 2] = [best_sum]
    return groups


def _sentence_start_before(prefix: str) -> bool:
    """True when text ``prefix`` ends where a new sentence may begin (see ``piece_starts``)."""
    stripped = prefix.rstrip(" \t")
    if not stripped or stripped.endswith(("\n", "\r")):
        return True
    # Terminal punctuation must be followed by whitespace: "3.5" or "e.g.So" are no sentence start.
    return stripped.endswith((".", "?", "!")) and len(stripped) < len(prefix)


def _keyword_at(text: str, pos: int, keywords: Sequence[str]) -> bool:
    """True when a keyword starts at ``text[pos]`` as a whole word ("So" must not match "Some")."""
    for keyword in keywords:
        if text.startswith(keyword, pos):
            end = pos + len(keyword)
            if end == len(text) or not (text[end].isalnum() or text[end] == "_"):
                return True
    return False


def piece_starts(
    token_texts: Sequence[str], keywords: Sequence[str] = DEFAULT_KEYWORDS, split_on_newline: bool = True
) -> list[int]:
    """Start token indices of the pieces of a trace, split at generic delimiters (section 3a).

    A piece starts at token 0, at the token after any token whose text contains a newline (when
    ``split_on_newline``), and at a token that begins a sentence-initial discourse keyword: after
    stripping the token's leading whitespace its text starts the keyword (which may run on over
    several tokens, e.g. "Let" + " me"), the keyword is a whole word, and the text before it is empty
    or ends with a newline or with ". ", "? ", "! ". Keywords that begin inside a token are ignored,
    since pieces can only be cut at token boundaries. Matching is case-sensitive.
    """
    n_tokens = len(token_texts)
    if n_tokens == 0:
        return []
    text = "".join(token_texts)
    starts = {0}
    offset = 0
    for i, token in enumerate(token_texts):
        if split_on_newline and "\n" in token and i + 1 < n_tokens:
            starts.add(i + 1)
        lead = len(token) - len(token.lstrip())
        # A whitespace-only token cannot begin a keyword; the keyword's own token will.
        if lead < len(token):
            pos = offset + lead
            if _sentence_start_before(text[:pos]) and _keyword_at(text, pos, keywords):
                starts.add(i)
        offset += len(token)
    return sorted(starts)


def segment_starts(piece_starts: Sequence[int], groups: Sequence[Sequence[int]]) -> list[int]:
    """Start token index of each merged segment: the start of its first piece."""
    _check_groups(groups, len(piece_starts))
    return [int(piece_starts[group[0]]) for group in groups]


def segment_ids_from_starts(starts: Sequence[int], n_tokens: int) -> torch.LongTensor:
    """Per-token segment id (0..K-1) for segments beginning at ``starts`` in a trace of ``n_tokens``."""
    _check_starts(starts, n_tokens)
    ids = torch.zeros(n_tokens, dtype=torch.long)
    for k, start in enumerate(starts[1:], start=1):
        ids[start:] = k
    return ids  # type: ignore[return-value]


def segment_ids_from_groups(
    piece_starts: Sequence[int], groups: Sequence[Sequence[int]], n_tokens: int
) -> torch.LongTensor:
    """Per-token segment id from piece start indices and merged piece groups (``merge_pieces``)."""
    return segment_ids_from_starts(segment_starts(piece_starts, groups), n_tokens)


def exit_cuts(segment_starts: Sequence[int], n_tokens: int) -> list[int]:
    """The K+1 exit points ``[b_0, …, b_{K-1}, L]`` for K segments (see the module docstring)."""
    _check_starts(segment_starts, n_tokens)
    return [int(s) for s in segment_starts] + [n_tokens]


def segment_trace(
    token_texts: Sequence[str],
    token_entropies: Sequence[float] | Tensor,
    n_segments: int,
    keywords: Sequence[str] = DEFAULT_KEYWORDS,
) -> list[int]:
    """Hybrid keyword-entropy segmentation: segment start indices (the first is 0) of one trace.

    Pieces from ``piece_starts`` are scored by the sum of their tokens' entropies and merged by
    ``merge_pieces`` down to ``n_segments``.
    """
    if len(token_texts) != len(token_entropies):
        raise ValueError(f"{len(token_texts)} token texts but {len(token_entropies)} entropies")
    starts = piece_starts(token_texts, keywords)
    if not starts:
        return []
    entropies = torch.as_tensor(token_entropies, dtype=torch.float64).flatten()
    bounds = starts + [len(token_texts)]
    piece_h = [float(entropies[a:b].sum()) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    return segment_starts(starts, merge_pieces(piece_h, n_segments))


def _check_starts(starts: Sequence[int], n_tokens: int) -> None:
    if n_tokens == 0:
        if len(starts) != 0:
            raise ValueError("an empty trace has no segments")
        return
    if len(starts) == 0 or starts[0] != 0:
        raise ValueError(f"segment starts must begin with 0, got {list(starts)}")
    if any(b <= a for a, b in zip(starts[:-1], starts[1:], strict=True)) or starts[-1] >= n_tokens:
        raise ValueError(f"segment starts must increase strictly and stay below {n_tokens}: {list(starts)}")


def _check_groups(groups: Sequence[Sequence[int]], n_pieces: int) -> None:
    flat = [i for group in groups for i in group]
    if flat != list(range(n_pieces)) or any(len(group) == 0 for group in groups):
        raise ValueError("groups must be non-empty runs of consecutive piece indices covering every piece")
