"""Tests of trace segmentation (rredcot.segmentation)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rredcot.segmentation import (
    DEFAULT_KEYWORDS,
    exit_cuts,
    merge_pieces,
    piece_starts,
    segment_ids_from_groups,
    segment_ids_from_starts,
    segment_starts,
    segment_trace,
)

FAST = settings(max_examples=200, deadline=None)
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
    # Newlines end tokens 2, 5 and 9; "Wait" after a whitespace-only token is sentence-initial.
    assert piece_starts(tokens, DEFAULT_KEYWORDS) == [0, 3, 6, 7, 10]
    # A trailing newline token starts no empty piece.
    assert piece_starts(["a", "\n"], DEFAULT_KEYWORDS) == [0]


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


def test_segment_trace_merges_low_entropy_pieces() -> None:
    # Pieces start at 0, 9, 18, 24; give the middle two little entropy so they merge.
    entropies = torch.full((len(TRACE),), 0.01)
    entropies[:9] = 1.0
    entropies[24:] = 1.0
    assert segment_trace(TRACE, entropies, 3) == [0, 9, 24]
    assert segment_trace(TRACE, entropies, 1) == [0]
    assert segment_trace(TRACE, entropies, 10) == [0, 9, 18, 24]
    assert segment_trace([], [], 3) == []
    cuts = exit_cuts(segment_trace(TRACE, entropies, 3), len(TRACE))
    assert cuts == [0, 9, 24, len(TRACE)]
