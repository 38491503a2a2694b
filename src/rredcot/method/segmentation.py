"""Hybrid keyword-entropy segmentation of a trace (docs/method.md, "From a trace to σ").

    token texts --piece_starts--> pieces (cut at newlines and sentence-initial keywords)
    pieces --enforce_min_length--> groups of pieces, each at least ``min_segment_tokens`` long
    groups + entropies --merge_pieces--> K segments (lowest-entropy neighbours merged first)
    K segments --homogenize_groups--> K segments with boundaries shifted to even out their entropies

``segment_trace`` runs the whole chain under a :class:`SegmentationConfig`. Segments are described by
their start token indices ``[0, b_1, …, b_{K-1}]``; ``exit_cuts`` turns them into the K+1 exit points
scored by ``rredcot.method.scoring`` (see ``rredcot.method.credit`` for the convention).

Every step works on per-piece entropy sums and token lengths only, so the cost is linear in the trace
length plus ``O(P log P)`` in the number of pieces P.
"""

from __future__ import annotations

import functools
import heapq
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

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

# A homogenizing move must lower the sum of squared segment entropies by more than this fraction of
# the squared total, so float rounding can never make two boundary positions trade places forever.
_HOMOGENIZE_RTOL = 1e-12


# --------------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------------


@dataclass
class SegmentationConfig:
    """How ``segment_trace`` cuts a trace into K segments (K+1 exit points); docs/method.md, "From a
    trace to σ".

    The defaults reproduce the method's decisions; validation happens on construction so a bad value
    fails before any training step, with a message naming the field.
    """

    keywords: tuple[str, ...] = DEFAULT_KEYWORDS
    """Sentence-initial discourse keywords that start a new piece (case-sensitive, whole words)."""

    split_on_newline: bool = True
    """Also start a new piece after every token that contains a newline."""

    n_segments: int = 6
    """Absolute target number of segments K (K+1 exit points), used when ``tokens_per_segment`` is 0."""

    tokens_per_segment: int = 0
    """When > 0, the target follows the trace length: K = ceil(L / tokens_per_segment), clipped to
    ``[1, max_segments]``, so long traces get proportionally more exit points. Overrides ``n_segments``."""

    max_segments: int = 64
    """Upper bound on the per-token target, which caps the exit-scoring cost of very long traces."""

    min_segment_tokens: int = 4
    """Minimum segment length in tokens; shorter pieces are merged into a neighbour before anything else,
    so no exit point is spent on a fragment like a lone "Wait,"."""

    homogenize: bool = True
    """After merging, shift boundaries to neighbouring piece starts while that lowers the variance of the
    segment entropies (docs/method.md, "From a trace to σ")."""

    def __post_init__(self) -> None:
        if isinstance(self.keywords, str) or not all(isinstance(k, str) and k for k in self.keywords):
            raise ValueError(f"keywords must be a sequence of non-empty strings, got {self.keywords!r}")
        self.keywords = tuple(self.keywords)
        for name in ("split_on_newline", "homogenize"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        for name, minimum in (
            ("n_segments", 1),
            ("tokens_per_segment", 0),
            ("max_segments", 1),
            ("min_segment_tokens", 1),
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")

    def target_segments(self, n_tokens: int) -> int:
        """Target number of segments K for a trace of ``n_tokens`` tokens (at least 1)."""
        if n_tokens < 0:
            raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")
        if self.tokens_per_segment == 0:
            return self.n_segments
        return min(max(1, -(-n_tokens // self.tokens_per_segment)), self.max_segments)


# --------------------------------------------------------------------------------------------------
# Merging pieces
# --------------------------------------------------------------------------------------------------


def _as_floats(values: Sequence[float] | Tensor) -> list[float]:
    if isinstance(values, Tensor):
        return values.detach().double().cpu().flatten().tolist()
    return [float(v) for v in values]


def merge_pieces(piece_entropies: Sequence[float] | Tensor, n_segments: int) -> list[list[int]]:
    """Greedily merge adjacent pieces until ``n_segments`` groups remain.

    Each step merges the adjacent pair of groups whose summed entropy is lowest (ties go to the
    leftmost pair), so predictable low-entropy text is lumped together and the exit-point budget is
    spent where the model was uncertain. Returns groups of consecutive piece indices, in order,
    covering every piece; with no more pieces than ``n_segments`` every piece is its own group.

    A heap with lazily discarded stale pairs keeps this ``O(P log P)`` rather than a rescan of all
    pairs per merge; the result is identical to that rescan (same sums, same tie-breaking).
    """
    if n_segments < 1:
        raise ValueError(f"n_segments must be >= 1, got {n_segments}")
    sums = _as_floats(piece_entropies)
    n = len(sums)
    if n == 0:
        return []
    # Groups are linked lists of live ids; a group's id is its first piece, so ids order by position.
    nxt = list(range(1, n + 1))
    prv = list(range(-1, n - 1))
    version = [0] * n
    heap = [(sums[i] + sums[i + 1], i, i + 1, 0, 0) for i in range(n - 1)]
    heapq.heapify(heap)
    n_groups = n
    while n_groups > n_segments:
        pair_sum, left, right, v_left, v_right = heapq.heappop(heap)
        if nxt[left] != right or version[left] != v_left or version[right] != v_right:
            continue  # stale: one side has merged since this pair was pushed
        sums[left] = pair_sum
        version[left] += 1
        version[right] = -1  # dead
        nxt[left] = nxt[right]
        if nxt[left] < n:
            prv[nxt[left]] = left
            after = nxt[left]
            heapq.heappush(heap, (pair_sum + sums[after], left, after, version[left], version[after]))
        if prv[left] >= 0:
            before = prv[left]
            heapq.heappush(heap, (sums[before] + pair_sum, before, left, version[before], version[left]))
        n_groups -= 1
    starts = [i for i in range(n) if version[i] >= 0]
    return [list(range(a, b)) for a, b in zip(starts, starts[1:] + [n], strict=True)]


def enforce_min_length(
    piece_entropies: Sequence[float] | Tensor, piece_lengths: Sequence[int], min_tokens: int
) -> list[list[int]]:
    """Group pieces so that every group has at least ``min_tokens`` tokens (docs/method.md, "From a
    trace to σ").

    The leftmost too-short group is merged into the neighbour that gives the lower combined entropy
    (ties: left), repeatedly, so short fragments join the more predictable side and keep the uncertain
    text separate. Stops when every group is long enough or only one group remains, which happens only
    when the whole trace is shorter than ``min_tokens``. Runs in one left-to-right pass: once the
    leftmost short group merges left it is long enough, because everything to its left already was.
    """
    if min_tokens < 1:
        raise ValueError(f"min_tokens must be >= 1, got {min_tokens}")
    entropies = _as_floats(piece_entropies)
    if len(entropies) != len(piece_lengths):
        raise ValueError(f"{len(entropies)} piece entropies but {len(piece_lengths)} piece lengths")
    groups: list[list[int]] = []
    sums: list[float] = []
    lengths: list[int] = []
    i, n = 0, len(entropies)
    while i < n:
        group, total, length = [i], entropies[i], int(piece_lengths[i])
        i += 1
        while length < min_tokens and (groups or i < n):
            # Combined entropies are total + neighbour, so comparing the neighbours suffices.
            if groups and (i == n or sums[-1] <= entropies[i]):
                groups[-1] += group
                sums[-1] += total
                lengths[-1] += length
                break
            group.append(i)
            total += entropies[i]
            length += int(piece_lengths[i])
            i += 1
        else:
            groups.append(group)
            sums.append(total)
            lengths.append(length)
    return groups


def merge_groups(
    piece_entropies: Sequence[float] | Tensor, groups: Sequence[Sequence[int]], n_segments: int
) -> list[list[int]]:
    """``merge_pieces`` applied to existing groups of pieces (each group scored by its entropy sum)."""
    entropies = _as_floats(piece_entropies)
    _check_groups(groups, len(entropies))
    group_sums = [math.fsum(entropies[j] for j in group) for group in groups]
    return [[j for g in merged for j in groups[g]] for merged in merge_pieces(group_sums, n_segments)]


# --------------------------------------------------------------------------------------------------
# Homogenizing segment entropies
# --------------------------------------------------------------------------------------------------


class _Boundaries:
    """Segment boundaries over pieces, with the cached sums a homogenizing move needs.

    ``bounds[k]`` is the first piece of segment k and ``bounds[K]`` the number of pieces. Moving a
    boundary changes only its two neighbouring segments, so a move is scored in O(1): with the total
    fixed, lowering the variance is lowering the sum of squares, and moving a piece of entropy h from a
    segment with sum a to one with sum b changes it by ``2h(h + b - a)``.
    """

    def __init__(
        self, entropies: list[float], lengths: Sequence[int], groups: Sequence[Sequence[int]], min_tokens: int
    ) -> None:
        self.h = entropies
        self.len_prefix = [0, *accumulate(int(x) for x in lengths)]
        self.bounds = [int(group[0]) for group in groups] + [len(entropies)]
        self.sums = [
            math.fsum(entropies[a:b]) for a, b in zip(self.bounds[:-1], self.bounds[1:], strict=True)
        ]
        self.min_tokens = min_tokens

    def seg_tokens(self, first: int, stop: int) -> int:
        return self.len_prefix[stop] - self.len_prefix[first]

    def best_move(self, j: int) -> tuple[float, int]:
        """(change of the sum of squares, direction -1/+1) of boundary j's better move; +inf if none."""
        b, sums = self.bounds, self.sums
        best = (math.inf, 0)
        # Left: piece b[j]-1 leaves segment j-1, which must stay non-empty and long enough.
        p = b[j] - 1
        if p > b[j - 1] and self.seg_tokens(b[j - 1], p) >= self.min_tokens:
            h = self.h[p]
            best = (2.0 * h * (h + sums[j] - sums[j - 1]), -1)
        # Right: piece b[j] leaves segment j.
        p = b[j]
        if p + 1 < b[j + 1] and self.seg_tokens(p + 1, b[j + 1]) >= self.min_tokens:
            h = self.h[p]
            delta = 2.0 * h * (h + sums[j - 1] - sums[j])
            if delta < best[0]:
                best = (delta, +1)
        return best

    def move(self, j: int, direction: int) -> None:
        b = self.bounds
        b[j] += direction
        self.sums[j - 1] = math.fsum(self.h[b[j - 1] : b[j]])
        self.sums[j] = math.fsum(self.h[b[j] : b[j + 1]])

    def groups(self) -> list[list[int]]:
        return [list(range(a, c)) for a, c in zip(self.bounds[:-1], self.bounds[1:], strict=True)]


def homogenize_groups(
    piece_entropies: Sequence[float] | Tensor,
    piece_lengths: Sequence[int],
    groups: Sequence[Sequence[int]],
    min_tokens: int,
    max_rounds: int | None = None,
) -> list[list[int]]:
    """Shift segment boundaries to even out segment entropies, keeping the number of segments (METHOD 3d).

    Greedy merging leaves some segments far more uncertain than others; evening them out spreads the
    exit points so each segment carries a comparable share of the trace's uncertainty. Each round
    applies the single move that lowers the variance of the segment entropy sums the most, where a move
    shifts one boundary by one piece left or right without emptying a segment or making one shorter
    than ``min_tokens`` (segments that already were shorter are never shrunk). Ties go to the leftmost
    boundary, then to the left move. Stops when no move lowers the variance by more than rounding noise,
    or after ``max_rounds`` rounds (default ``10 * P``), a safety net: each move strictly lowers the
    variance, so the loop cannot cycle.
    """
    entropies = _as_floats(piece_entropies)
    if len(entropies) != len(piece_lengths):
        raise ValueError(f"{len(entropies)} piece entropies but {len(piece_lengths)} piece lengths")
    _check_groups(groups, len(entropies))
    if len(groups) < 2:
        return [list(group) for group in groups]
    state = _Boundaries(entropies, piece_lengths, groups, min_tokens)
    tolerance = _HOMOGENIZE_RTOL * math.fsum(abs(h) for h in entropies) ** 2
    n_bounds = len(groups)  # boundaries 1..K-1
    # deltas[j], directions[j]: boundary j's best move (index 0 is a never-chosen placeholder).
    deltas, directions = [math.inf] * n_bounds, [0] * n_bounds
    for j in range(1, n_bounds):
        deltas[j], directions[j] = state.best_move(j)
    for _ in range(10 * len(entropies) if max_rounds is None else max_rounds):
        j = min(range(1, n_bounds), key=deltas.__getitem__)  # first minimum: leftmost on ties
        if not deltas[j] < -tolerance:
            break
        state.move(j, directions[j])
        for k in range(max(1, j - 1), min(n_bounds, j + 2)):
            deltas[k], directions[k] = state.best_move(k)
    return state.groups()


def segment_pieces(
    piece_entropies: Sequence[float] | Tensor,
    piece_lengths: Sequence[int],
    n_segments: int,
    min_tokens: int,
    homogenize: bool,
) -> list[list[int]]:
    """Pieces to at most ``n_segments`` groups: min length, entropy merging, then homogenizing.

    Fewer than ``n_segments`` groups come back when there are too few pieces of the minimum length.
    """
    groups = enforce_min_length(piece_entropies, piece_lengths, min_tokens)
    groups = merge_groups(piece_entropies, groups, n_segments)
    if homogenize:
        groups = homogenize_groups(piece_entropies, piece_lengths, groups, min_tokens)
    return groups


# --------------------------------------------------------------------------------------------------
# Keyword splitting
# --------------------------------------------------------------------------------------------------


def _sentence_start_at(text: str, pos: int) -> bool:
    """True when ``text[:pos]`` ends where a new sentence may begin (see ``piece_starts``).

    Scans back over spaces instead of slicing the prefix, which would be quadratic in the trace length.
    """
    i = pos
    while i > 0 and text[i - 1] in " \t":
        i -= 1
    if i == 0 or text[i - 1] in "\n\r":
        return True
    # Terminal punctuation must be followed by whitespace: "3.5" or "e.g.So" are no sentence start.
    return text[i - 1] in ".?!" and i < pos


@functools.lru_cache(maxsize=32)
def _keyword_pattern(keywords: tuple[str, ...]) -> re.Pattern[str] | None:
    """Matches a keyword starting at a position as a whole word: one alternation, then no word character.

    ``(?!\\w)`` is "not alphanumeric (``str.isalnum``) and not ``_``", i.e. a whole word ("So" must not
    match "Some"); backtracking through the alternatives makes it "any keyword matches". One regex
    match per token replaces a Python loop over the keywords, the hot spot on long traces.
    """
    if not keywords:
        return None
    return re.compile("(?:" + "|".join(re.escape(k) for k in keywords) + r")(?!\w)")


def piece_starts(
    token_texts: Sequence[str], keywords: Sequence[str] = DEFAULT_KEYWORDS, split_on_newline: bool = True
) -> list[int]:
    """Start token indices of the pieces of a trace, split at generic delimiters (section 3a).

    A piece starts at token 0, after any token whose text contains a newline (when
    ``split_on_newline``), and at a token that begins a sentence-initial discourse keyword: after
    stripping the token's leading whitespace its text starts the keyword (which may run on over
    several tokens, e.g. "Let" + " me"), the keyword is a whole word, and the text before it is empty
    or ends with a newline or with ". ", "? ", "! ". Keywords that begin inside a token are ignored,
    since pieces can only be cut at token boundaries. Matching is case-sensitive.

    A token that holds a newline and then text (``"\nSo"``, ``".\nThe"``, which some BPE vocabularies
    have) starts the new line itself, so the piece starts at that token, not after it: the line's
    first word stays in the line's piece.
    """
    n_tokens = len(token_texts)
    if n_tokens == 0:
        return []
    text = "".join(token_texts)
    pattern = _keyword_pattern(tuple(keywords))
    starts = {0}
    offset = 0
    for i, token in enumerate(token_texts):
        if split_on_newline and "\n" in token:
            if token[token.rindex("\n") + 1 :].strip():
                starts.add(i)  # the new line begins inside this token
            elif i + 1 < n_tokens:
                starts.add(i + 1)
        lead = len(token) - len(token.lstrip())
        # A whitespace-only token cannot begin a keyword; the keyword's own token will.
        if pattern is not None and lead < len(token):
            pos = offset + lead
            if pattern.match(text, pos) and _sentence_start_at(text, pos):
                starts.add(i)
        offset += len(token)
    return sorted(starts)


# --------------------------------------------------------------------------------------------------
# Segments, token ids and exit points
# --------------------------------------------------------------------------------------------------


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


def token_at(token_texts: Sequence[str], char: int) -> int | None:
    """Index of the token holding character ``char`` of ``"".join(token_texts)``: the last token
    for a character past the end, None when there are no tokens."""
    if char < 0:
        raise ValueError(f"character offset {char} is negative")
    end = 0
    for j, text in enumerate(token_texts):
        end += len(text)
        if end > char:
            return j
    return len(token_texts) - 1 if token_texts else None


def find_text(token_texts: Sequence[str], needle: str, start: int = 0, last: bool = False) -> int | None:
    """Index of the token holding the first character of ``needle`` in ``token_texts[start:]``.

    The first occurrence, or the last with ``last=True``; None when the text does not occur.
    """
    if not needle:
        raise ValueError("cannot search for an empty text")
    offset = sum(len(t) for t in token_texts[:start])
    text = "".join(token_texts[start:])
    at = text.rfind(needle) if last else text.find(needle)
    return None if at < 0 else token_at(token_texts, offset + at)


def find_text_at_end(token_texts: Sequence[str], needle: str) -> int | None:
    """``find_text`` for a text that grows one token at a time and is searched after every token: an
    occurrence that ended before the last token was found then, so only one that ends in the last
    token is looked for, among the few tokens it can span (the cost does not grow with the text)."""
    if not needle:
        raise ValueError("cannot search for an empty text")
    if not token_texts:
        return None
    # Tokens before the last that the needle can reach back into: len(needle) - 1 characters.
    first, reach = len(token_texts) - 1, len(needle) - 1
    while first > 0 and reach > 0:
        first -= 1
        reach -= len(token_texts[first])
    tail = token_texts[first:]
    at = "".join(tail).find(needle)
    return None if at < 0 else first + token_at(tail, at)


def thinking_end(token_texts: Sequence[str], exit_string: str) -> int | None:
    """Index of the token where the model's own exit string begins, or None if it never exits.

    The first occurrence of ``exit_string`` (surrounding whitespace stripped, so ``"\n</think>\n\n"``
    also finds a bare ``</think>``) is looked up with ``find_text``: the thinking part is
    ``tokens[:e]``, the answer ``tokens[e:]``.
    """
    needle = exit_string.strip()
    if not needle:
        raise ValueError("exit_string is empty after stripping whitespace")
    return find_text(token_texts, needle)


def segment_trace(
    token_texts: Sequence[str],
    token_entropies: Sequence[float] | Tensor,
    config: SegmentationConfig | None = None,
) -> list[int]:
    """Hybrid keyword-entropy segmentation: segment start indices (the first is 0) of one trace.

    Pieces from ``piece_starts`` are scored by the exact sum of their tokens' entropies, then
    ``segment_pieces`` enforces the minimum length, merges down to ``config.target_segments(L)`` and
    homogenizes. An empty trace has no segments.
    """
    config = SegmentationConfig() if config is None else config
    entropies = _as_floats(token_entropies)
    if len(token_texts) != len(entropies):
        raise ValueError(f"{len(token_texts)} token texts but {len(entropies)} entropies")
    starts = piece_starts(token_texts, config.keywords, config.split_on_newline)
    if not starts:
        return []
    bounds = starts + [len(token_texts)]
    pairs = list(zip(bounds[:-1], bounds[1:], strict=True))
    piece_h = [math.fsum(entropies[a:b]) for a, b in pairs]
    piece_len = [b - a for a, b in pairs]
    target = config.target_segments(len(token_texts))
    groups = segment_pieces(piece_h, piece_len, target, config.min_segment_tokens, config.homogenize)
    return segment_starts(starts, groups)


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
