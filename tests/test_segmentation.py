"""Tests of trace segmentation (rredcot.method.segmentation)."""

from __future__ import annotations

import math
import statistics

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rredcot.method.segmentation import (
    DEFAULT_KEYWORDS,
    SegmentationConfig,
    enforce_min_length,
    exit_cuts,
    homogenize_groups,
    merge_groups,
    merge_pieces,
    piece_starts,
    segment_ids_from_groups,
    segment_ids_from_starts,
    segment_pieces,
    segment_starts,
    segment_trace,
)

FAST = settings(max_examples=200, deadline=None)

ENTROPY = st.floats(min_value=0.0, max_value=1e3, allow_nan=False)
# Few distinct values, so that ties (and their left-first rule) are exercised often.
TIED_ENTROPY = st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0])


@st.composite
def pieces(draw: st.DrawFn, max_pieces: int = 40) -> tuple[list[float], list[int]]:
    """Random piece entropies and token lengths of equal count."""
    n = draw(st.integers(min_value=0, max_value=max_pieces))
    entropies = draw(st.lists(st.one_of(ENTROPY, TIED_ENTROPY), min_size=n, max_size=n))
    lengths = draw(st.lists(st.integers(min_value=1, max_value=12), min_size=n, max_size=n))
    return entropies, lengths


def _is_cover(groups: list[list[int]], n_pieces: int) -> bool:
    """Groups are non-empty runs of consecutive piece indices covering every piece in order."""
    in_order = [i for group in groups for i in group] == list(range(n_pieces))
    return in_order and all(group and group == list(range(group[0], group[-1] + 1)) for group in groups)


def _group_sums(values: list[float], groups: list[list[int]]) -> list[float]:
    return [math.fsum(values[i] for i in group) for group in groups]


def _variance(entropies: list[float], groups: list[list[int]]) -> float:
    return statistics.pvariance(_group_sums(entropies, groups)) if groups else 0.0


def _merge_pieces_reference(entropies: list[float], n_segments: int) -> list[list[int]]:
    """The original rescan-all-pairs merge, against which the heap version is checked."""
    groups = [[i] for i in range(len(entropies))]
    sums = list(entropies)
    while len(groups) > n_segments:
        best, best_sum = 0, sums[0] + sums[1]
        for i in range(1, len(groups) - 1):
            if sums[i] + sums[i + 1] < best_sum:
                best, best_sum = i, sums[i] + sums[i + 1]
        groups[best : best + 2] = [groups[best] + groups[best + 1]]
        sums[best : best + 2] = [best_sum]
    return groups


# --------------------------------------------------------------------------------------------------
# Merging pieces
# --------------------------------------------------------------------------------------------------


def test_merge_pieces_hand_examples() -> None:
    # Lowest pair sum first: (1,2)=3 -> [[0],[1,2],[3]] sums 5,3,4 -> (0,[1,2])=8 vs ([1,2],3)=7.
    assert merge_pieces([5.0, 1.0, 2.0, 4.0], 2) == [[0], [1, 2, 3]]
    assert merge_pieces([5.0, 1.0, 2.0, 4.0], 3) == [[0], [1, 2], [3]]
    # Ties go to the leftmost pair.
    assert merge_pieces([1.0, 1.0, 1.0, 1.0], 3) == [[0, 1], [2], [3]]
    assert merge_pieces([1.0, 1.0, 1.0, 1.0], 2) == [[0, 1], [2, 3]]
    assert merge_pieces(torch.tensor([3.0, 0.0, 0.0, 3.0]), 3) == [[0], [1, 2], [3]]


def test_merge_pieces_edge_cases() -> None:
    assert merge_pieces([2.0, 1.0, 3.0], 3) == [[0], [1], [2]]
    assert merge_pieces([2.0, 1.0, 3.0], 10) == [[0], [1], [2]]
    assert merge_pieces([2.0, 1.0, 3.0], 1) == [[0, 1, 2]]
    assert merge_pieces([], 4) == []
    with pytest.raises(ValueError):
        merge_pieces([1.0], 0)


@FAST
@given(
    st.lists(st.floats(min_value=0.0, max_value=1e3, allow_nan=False), max_size=40),
    st.integers(min_value=1, max_value=45),
)
def test_merge_pieces_covers_in_order(entropies: list[float], n_segments: int) -> None:
    groups = merge_pieces(entropies, n_segments)
    assert len(groups) == min(n_segments, len(entropies))
    assert [i for group in groups for i in group] == list(range(len(entropies)))
    assert all(group == list(range(group[0], group[-1] + 1)) for group in groups)


@FAST
@given(
    st.lists(st.one_of(ENTROPY, TIED_ENTROPY), max_size=40),
    st.integers(min_value=1, max_value=45),
)
def test_merge_pieces_matches_rescan_reference(entropies: list[float], n_segments: int) -> None:
    assert merge_pieces(entropies, n_segments) == _merge_pieces_reference(entropies, n_segments)


def test_merge_groups_merges_whole_groups() -> None:
    # Group sums 6, 1, 2, 9: the (1, 2) pair merges first.
    groups = [[0, 1], [2], [3], [4, 5]]
    assert merge_groups([3.0, 3.0, 1.0, 2.0, 4.0, 5.0], groups, 3) == [[0, 1], [2, 3], [4, 5]]
    assert merge_groups([3.0, 3.0, 1.0, 2.0, 4.0, 5.0], groups, 9) == groups


# --------------------------------------------------------------------------------------------------
# Minimum segment length
# --------------------------------------------------------------------------------------------------


def test_enforce_min_length_hand_examples() -> None:
    # Piece 1 is short: left (1) beats right (2). Piece 2 is short: the left group (6) loses to piece 3 (3).
    assert enforce_min_length([1.0, 5.0, 2.0, 3.0], [3, 1, 1, 4], 2) == [[0, 1], [2, 3]]
    # Ties go left.
    assert enforce_min_length([1.0, 0.0, 1.0], [2, 1, 2], 2) == [[0, 1], [2]]
    # A short first piece has only a right neighbour and keeps absorbing until long enough.
    assert enforce_min_length([0.0, 0.0, 0.0, 0.0], [1, 1, 1, 5], 3) == [[0, 1, 2], [3]]
    # A short last piece can only go left.
    assert enforce_min_length([0.0, 9.0], [4, 1], 2) == [[0, 1]]
    # Everything long enough: unchanged. Whole trace too short: one group. No pieces: no groups.
    assert enforce_min_length([1.0, 2.0], [3, 3], 3) == [[0], [1]]
    assert enforce_min_length([1.0, 2.0], [1, 1], 5) == [[0, 1]]
    assert enforce_min_length([], [], 3) == []
    with pytest.raises(ValueError, match="min_tokens"):
        enforce_min_length([1.0], [1], 0)
    with pytest.raises(ValueError, match="lengths"):
        enforce_min_length([1.0], [1, 2], 1)


@FAST
@given(pieces(), st.integers(min_value=1, max_value=30))
def test_enforce_min_length_properties(data: tuple[list[float], list[int]], min_tokens: int) -> None:
    entropies, lengths = data
    groups = enforce_min_length(entropies, lengths, min_tokens)
    assert _is_cover(groups, len(entropies))
    if sum(lengths) >= min_tokens:
        assert all(sum(lengths[i] for i in group) >= min_tokens for group in groups)
    else:
        assert len(groups) == min(1, len(entropies))
    # Pieces already long enough are left alone when nothing around them is short.
    if all(length >= min_tokens for length in lengths):
        assert groups == [[i] for i in range(len(entropies))]


# --------------------------------------------------------------------------------------------------
# Homogenizing
# --------------------------------------------------------------------------------------------------


def test_homogenize_lowers_variance() -> None:
    entropies, lengths = [5.0, 5.0, 1.0, 1.0], [1, 1, 1, 1]
    # Sums (11, 1) -> (10, 2) -> (5, 7); emptying the first segment is not allowed.
    groups = homogenize_groups(entropies, lengths, [[0, 1, 2], [3]], 1)
    assert groups == [[0], [1, 2, 3]]
    assert _variance(entropies, groups) < _variance(entropies, [[0, 1, 2], [3]])
    # Three segments, sums (2, 2, 4) -> (2, 3, 3): the second boundary moves right by one piece.
    entropies = [2.0, 2.0, 1.0, 1.0, 1.0, 1.0]
    assert homogenize_groups(entropies, [1] * 6, [[0], [1], [2, 3, 4, 5]], 1) == [[0], [1, 2], [3, 4, 5]]
    # Single-piece moves stop at a plateau: (1, 1, 4) -> (1, 2, 3), and every further move keeps the
    # sum of squares at 14, so the balanced (2, 2, 2) is not reached.
    assert homogenize_groups([1.0] * 6, [1] * 6, [[0], [1], [2, 3, 4, 5]], 1) == [[0], [1, 2], [3, 4, 5]]


def test_homogenize_changes_nothing_when_balanced_or_blocked() -> None:
    assert homogenize_groups([2.0, 2.0, 2.0, 2.0], [1] * 4, [[0, 1], [2, 3]], 1) == [[0, 1], [2, 3]]
    # Moving piece 3 left would give (3, 11), worse than (4, 10); moving right would empty segment 1.
    groups = [[0, 1, 2, 3], [4]]
    assert homogenize_groups([1.0, 1.0, 1.0, 1.0, 10.0], [1] * 5, groups, 1) == groups
    # The minimum length blocks the move that would even out (11, 1).
    assert homogenize_groups([5.0, 5.0, 1.0, 1.0], [1, 1, 1, 1], [[0, 1, 2], [3]], min_tokens=3) == [
        [0, 1, 2],
        [3],
    ]
    # One segment or none: nothing to move.
    assert homogenize_groups([1.0, 2.0], [1, 1], [[0, 1]], 1) == [[0, 1]]
    assert homogenize_groups([], [], [], 1) == []
    with pytest.raises(ValueError):
        homogenize_groups([1.0, 2.0], [1, 1], [[0], [0, 1]], 1)


@FAST
@given(pieces(), st.integers(min_value=1, max_value=45), st.integers(min_value=1, max_value=20))
def test_homogenize_properties(data: tuple[list[float], list[int]], n_segments: int, min_tokens: int) -> None:
    entropies, lengths = data
    before = merge_groups(entropies, enforce_min_length(entropies, lengths, min_tokens), n_segments)
    after = homogenize_groups(entropies, lengths, before, min_tokens)
    assert _is_cover(after, len(entropies))
    assert len(after) == len(before)
    var_before, var_after = _variance(entropies, before), _variance(entropies, after)
    assert var_after <= var_before + 1e-9 * (1.0 + var_before)
    if sum(lengths) >= min_tokens:
        assert all(sum(lengths[i] for i in group) >= min_tokens for group in after)
    # Deterministic, and a fixed point: homogenizing again changes nothing.
    assert homogenize_groups(entropies, lengths, before, min_tokens) == after
    assert homogenize_groups(entropies, lengths, after, min_tokens) == after


@FAST
@given(pieces(), st.integers(min_value=1, max_value=45), st.integers(min_value=1, max_value=20))
def test_segment_pieces_properties(
    data: tuple[list[float], list[int]], n_segments: int, min_tokens: int
) -> None:
    entropies, lengths = data
    groups = segment_pieces(entropies, lengths, n_segments, min_tokens, homogenize=True)
    assert _is_cover(groups, len(entropies))
    assert len(groups) <= n_segments
    if sum(lengths) >= min_tokens:
        assert all(sum(lengths[i] for i in group) >= min_tokens for group in groups)
    if min_tokens == 1:
        assert len(groups) == min(n_segments, len(entropies))


# --------------------------------------------------------------------------------------------------
# Keyword splitting and segmentation
# --------------------------------------------------------------------------------------------------

TRACE = ["First", ",", " 7", " +", " 5", " =", " 1", "2", ".\n", "Next", ",", " 1", "2", " -", " 3"]
TRACE += [" =", " 9", ".", " So", " the", " answer", " is", " 9", ".", " Wait", ",", " check", "."]


def test_piece_starts_newline_and_keywords() -> None:
    assert piece_starts(TRACE, DEFAULT_KEYWORDS) == [0, 9, 18, 24]
    # Without the newline rule "Next" still starts a piece: it follows a newline as a keyword.
    assert piece_starts(TRACE, DEFAULT_KEYWORDS, split_on_newline=False) == [0, 9, 18, 24]
    assert piece_starts(TRACE, ("Wait",), split_on_newline=False) == [0, 24]
    assert piece_starts([], DEFAULT_KEYWORDS) == []


def test_piece_starts_whole_words_and_sentence_start() -> None:
    assert piece_starts(["A", ".", " Some", " say", ".", " So", " yes"], DEFAULT_KEYWORDS) == [0, 5]
    # Not sentence-initial: "so" inside a sentence, "So" after a comma, "3.So" without a space.
    assert piece_starts(["A", ",", " So", " we", " 3", ".", "So"], DEFAULT_KEYWORDS) == [0]
    assert piece_starts(["Okay", ",", " go", "!", " Hmm", "?", " Thus"], DEFAULT_KEYWORDS) == [0, 4, 6]


def test_piece_starts_multi_token_keyword() -> None:
    tokens = ["x", ".", " Let", " me", " see", ".", " Let", "'s", " go", ".", " Let", " men"]
    assert piece_starts(tokens, DEFAULT_KEYWORDS) == [0, 2]
    # A keyword may also split inside a word: "Al" + "ternatively".
    assert piece_starts(["y", ".", " Al", "tern", "atively", ","], DEFAULT_KEYWORDS) == [0, 2]


def test_piece_starts_newline_inside_token() -> None:
    tokens = ["a", " b", ".\n\n", "c", " d", "\n", " ", "Wait", " e", "f\ng", "h"]
    # Newlines end tokens 2 and 5; "Wait" after a whitespace-only token is sentence-initial. Token 9
    # holds the end of a line and the start of the next ("g"): the new line's piece starts there.
    assert piece_starts(tokens, DEFAULT_KEYWORDS) == [0, 3, 6, 7, 9]
    # A trailing newline token starts no empty piece.
    assert piece_starts(["a", "\n"], DEFAULT_KEYWORDS) == [0]
    # A keyword that a newline token holds starts one piece, not two (at the keyword and after it).
    assert piece_starts(["x", ".", "\nSo", ",", " y"], DEFAULT_KEYWORDS) == [0, 2]
    assert piece_starts(["x", ".\nThe", " y", ".\n", "z"], DEFAULT_KEYWORDS) == [0, 1, 4]


def _piece_starts_reference(
    tokens: list[str], keywords: tuple[str, ...], split_on_newline: bool
) -> list[int]:
    """The original prefix-slicing, keyword-looping piece_starts, against which the fast one is checked."""
    text, starts, offset = "".join(tokens), {0} if tokens else set(), 0
    for i, token in enumerate(tokens):
        if split_on_newline and "\n" in token:
            if token.split("\n")[-1].strip():
                starts.add(i)
            elif i + 1 < len(tokens):
                starts.add(i + 1)
        lead = len(token) - len(token.lstrip())
        if lead < len(token):
            pos = offset + lead
            prefix = text[:pos]
            stripped = prefix.rstrip(" \t")
            sentence = not stripped or stripped.endswith(("\n", "\r"))
            sentence = sentence or (stripped.endswith((".", "?", "!")) and len(stripped) < len(prefix))
            keyword = any(
                text.startswith(k, pos)
                and (
                    pos + len(k) == len(text)
                    or not (text[pos + len(k)].isalnum() or text[pos + len(k)] == "_")
                )
                for k in keywords
            )
            if sentence and keyword:
                starts.add(i)
        offset += len(token)
    return sorted(starts)


TOKEN_PARTS = [
    "So",
    "Some",
    " So",
    "Let",
    " me",
    " men",
    "me",
    ".",
    ". ",
    "!",
    "?",
    "\n",
    " ",
    "\t",
    "x",
    "_",
    "é",
    "\r",
]


@FAST
@given(
    st.lists(st.lists(st.sampled_from(TOKEN_PARTS), min_size=1, max_size=3).map("".join), max_size=25),
    st.sampled_from([DEFAULT_KEYWORDS, ("So",), ("Some", "So"), ("me",), ("x.y", "a|b"), ()]),
    st.booleans(),
)
def test_piece_starts_matches_reference(tokens: list[str], keywords: tuple[str, ...], newline: bool) -> None:
    assert piece_starts(tokens, keywords, newline) == _piece_starts_reference(tokens, keywords, newline)


def test_segment_helpers() -> None:
    starts = [0, 2, 5, 6]
    groups = [[0, 1], [2], [3]]
    assert segment_starts(starts, groups) == [0, 5, 6]
    ids = segment_ids_from_groups(starts, groups, 8)
    assert ids.dtype == torch.long
    assert ids.tolist() == [0, 0, 0, 0, 0, 1, 2, 2]
    assert segment_ids_from_starts([0, 5, 6], 8).tolist() == ids.tolist()
    assert exit_cuts([0, 5, 6], 8) == [0, 5, 6, 8]
    assert exit_cuts([], 0) == [0]
    with pytest.raises(ValueError):
        exit_cuts([1, 5], 8)
    with pytest.raises(ValueError):
        segment_starts(starts, [[0], [2, 3]])


def _config(**kwargs: object) -> SegmentationConfig:
    return SegmentationConfig(**kwargs)  # type: ignore[arg-type]


def test_segment_trace_merges_low_entropy_pieces() -> None:
    # Pieces start at 0, 9, 18, 24 (lengths 9, 9, 6, 4); the middle two have little entropy and merge.
    entropies = torch.full((len(TRACE),), 0.01)
    entropies[:9] = 1.0
    entropies[24:] = 1.0
    assert segment_trace(TRACE, entropies, _config(n_segments=3)) == [0, 9, 24]
    assert segment_trace(TRACE, entropies, _config(n_segments=1)) == [0]
    assert segment_trace(TRACE, entropies, _config(n_segments=10)) == [0, 9, 18, 24]
    assert segment_trace(TRACE, entropies.tolist(), _config(n_segments=3, homogenize=False)) == [0, 9, 24]
    assert segment_trace([], [], _config(n_segments=3)) == []
    cuts = exit_cuts(segment_trace(TRACE, entropies, _config(n_segments=3)), len(TRACE))
    assert cuts == [0, 9, 24, len(TRACE)]
    with pytest.raises(ValueError, match="entropies"):
        segment_trace(TRACE, entropies[:-1])


def test_segment_trace_default_config_and_keywords() -> None:
    entropies = [1.0] * len(TRACE)
    # Default: 6 segments wanted, only 4 pieces.
    assert segment_trace(TRACE, entropies) == [0, 9, 18, 24]
    assert segment_trace(TRACE, entropies, _config(keywords=("Wait",), split_on_newline=False)) == [0, 24]


def test_segment_trace_min_length_and_homogenize() -> None:
    # Piece entropy sums 9, 9, 6, 4 with unit token entropies.
    entropies = [1.0] * len(TRACE)
    # Without homogenizing: (6, 4) merge first -> sums 9, 9, 10.
    assert segment_trace(TRACE, entropies, _config(n_segments=3, homogenize=False)) == [0, 9, 18]
    # Piece sums 3, 1, 1, 3, merged to two: (1, 1) first, then the tie goes left -> (5, 3), starts [0, 24].
    # Homogenizing moves the boundary one piece left, to the balanced (4, 4).
    skewed = [0.0] * len(TRACE)
    skewed[0], skewed[9], skewed[18], skewed[24] = 3.0, 1.0, 1.0, 3.0
    assert segment_trace(TRACE, skewed, _config(n_segments=2, homogenize=False)) == [0, 24]
    assert segment_trace(TRACE, skewed, _config(n_segments=2)) == [0, 18]
    # The last piece (4 tokens) is too short for min 5 and joins its only neighbour, on the left.
    assert segment_trace(TRACE, entropies, _config(n_segments=10, min_segment_tokens=5)) == [0, 9, 18]
    # A minimum longer than the whole trace leaves one segment.
    assert segment_trace(TRACE, entropies, _config(min_segment_tokens=100)) == [0]


def test_segment_trace_per_token_target() -> None:
    entropies = [1.0] * len(TRACE)
    # 28 tokens / 10 per segment -> 3 segments; capped at 2 by max_segments.
    assert len(segment_trace(TRACE, entropies, _config(tokens_per_segment=10, homogenize=False))) == 3
    assert len(segment_trace(TRACE, entropies, _config(tokens_per_segment=10, max_segments=2))) == 2


def _long_trace(n_sentences: int = 400, words: int = 9) -> list[str]:
    """About 10 tokens a sentence, each sentence starting with a keyword: one piece per sentence."""
    tokens: list[str] = []
    for i in range(n_sentences):
        tokens += [" So" if i else "So"] + [f" w{j}" for j in range(words - 1)] + ["."]
    return tokens


def test_segment_trace_on_a_long_trace() -> None:
    tokens = _long_trace()
    assert len(tokens) == 4000
    assert len(piece_starts(tokens)) == 400
    gen = torch.Generator().manual_seed(0)
    entropies = torch.rand(len(tokens), generator=gen, dtype=torch.float64).tolist()
    starts = segment_trace(tokens, entropies, _config(n_segments=40, min_segment_tokens=4))
    assert len(starts) == 40 and starts[0] == 0
    assert all(b - a >= 4 for a, b in zip(starts, [*starts[1:], len(tokens)], strict=True))


# --------------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------------


def test_config_target_segments() -> None:
    assert SegmentationConfig().target_segments(1000) == 6
    assert SegmentationConfig(n_segments=3).target_segments(0) == 3
    per_token = SegmentationConfig(tokens_per_segment=100, max_segments=5)
    assert [per_token.target_segments(n) for n in (0, 1, 100, 101, 250, 499, 501, 10_000)] == [
        1,
        1,
        1,
        2,
        3,
        5,
        5,
        5,
    ]
    with pytest.raises(ValueError, match="n_tokens"):
        per_token.target_segments(-1)


def test_config_keywords_become_a_tuple() -> None:
    config = SegmentationConfig(keywords=["Wait", "But"])  # type: ignore[arg-type]
    assert config.keywords == ("Wait", "But")
    assert SegmentationConfig().keywords == DEFAULT_KEYWORDS


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("n_segments", 0),
        ("n_segments", 2.5),
        ("tokens_per_segment", -1),
        ("max_segments", 0),
        ("min_segment_tokens", 0),
        ("min_segment_tokens", True),
        ("keywords", "Wait"),
        ("keywords", ("Wait", "")),
        ("split_on_newline", 1),
        ("homogenize", None),
    ],
)
def test_config_validation_names_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        SegmentationConfig(**{field: value})  # type: ignore[arg-type]


def test_thinking_end_finds_the_token_that_starts_the_exit():
    from rredcot.method.segmentation import thinking_end

    texts = ["So", " 2", ".\n</", "think", ">", "\n", "2"]
    assert thinking_end(texts, "</think>\n") == 2  # the token holding "<" of "</think>"
    assert thinking_end(["</think>", "\n", "x"], "\n</think>\n\n") == 0  # whitespace is stripped
    assert thinking_end(["a", "</think>", "b", "</think>"], "</think>") == 1  # the first exit counts
    assert thinking_end(["no", " exit"], "</think>") is None
    with pytest.raises(ValueError, match="empty"):
        thinking_end(["a"], " \n")


def test_find_text_first_last_and_from_a_start_token():
    from rredcot.method.segmentation import find_text

    texts = ["a", " \\", "boxed", "{1", "}", " \\", "boxed", "{2}"]
    assert find_text(texts, "\\boxed{") == 1
    assert find_text(texts, "\\boxed{", last=True) == 5
    assert find_text(texts, "\\boxed{", start=2) == 5  # the search starts at token 2
    assert find_text(texts, "{2}", start=7) == 7
    assert find_text(texts, "\\boxed{", start=6) is None
    with pytest.raises(ValueError):
        find_text(texts, "")


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from(["", "a", "b", "ab", "\\", "box", "ed{", "{", "x\\boxed{"]), max_size=12),
    st.sampled_from(["\\boxed{", "ab", "a", "bb{"]),
)
def test_find_text_at_end_finds_what_a_full_search_finds_first(texts, needle):
    """Searched after every token, the tail search stops where the full search first succeeds."""
    from rredcot.method.segmentation import find_text, find_text_at_end

    for n in range(1, len(texts) + 1):
        full = find_text(texts[:n], needle)
        if full is not None:
            assert find_text_at_end(texts[:n], needle) == full
            return
        assert find_text_at_end(texts[:n], needle) is None


def test_token_at_maps_a_character_to_its_token():
    from rredcot.method.segmentation import token_at

    texts = ["First", ",", " +", " 8", " =", " 4", ".\n"]
    joined = "".join(texts)
    assert [token_at(texts, i) for i in range(len(joined))] == [j for j, t in enumerate(texts) for _ in t]
    assert token_at(texts, len(joined) + 3) == len(texts) - 1  # past the end: the last token
    assert token_at([], 0) is None
    with pytest.raises(ValueError, match="negative"):
        token_at(texts, -1)
