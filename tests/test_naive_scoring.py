"""Tests of batched teacher-forced exit-point scoring against one-sequence-at-a-time forward passes."""

from __future__ import annotations

import pytest
import torch
from numerics import log_prob_sum_tol, model_terms
from tiny_models import tiny_qwen
from transformers import Qwen2ForCausalLM

from rredcot.method.credit import pr_log_value
from rredcot.method.scoring.naive import score_exit_points, score_reference_pairs
from rredcot.method.scoring.types import ExitScores

pytestmark = pytest.mark.numerics  # compares two computations (tests/numerics.py)

VOCAB = 50


@pytest.fixture(scope="module")
def model() -> Qwen2ForCausalLM:
    return tiny_qwen(VOCAB, 0, max_positions=256)


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(1, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


PROMPT = _ids(7, 1)
COMPLETION = _ids(23, 2)
EXIT = _ids(3, 3)
SOLUTION = _ids(9, 4)
ANSWER = _ids(2, 5)
PREFIX = _ids(2, 6)
SUFFIX = _ids(1, 7)
CUTS = [0, 4, 11, 17, len(COMPLETION)]
# Sequences of at most prompt 7 + completion 23 + exit 3 + solution 12 + prefix 2 + answer 3 + suffix 1
# tokens; a sum scores at most 12 of them (tests/numerics.py).
SEQ_LEN, SCORED = 51, 12


def _tol(model: Qwen2ForCausalLM) -> dict[str, float]:
    return log_prob_sum_tol(model_terms(model, SEQ_LEN), SCORED)


def _reference(
    model: Qwen2ForCausalLM, cut: int, solution: list[int], answer: list[int]
) -> tuple[float, float]:
    """Score one sequence with a plain forward pass and manual log-softmax gathering."""
    head = PROMPT + COMPLETION[:cut] + EXIT
    ids = head + solution + PREFIX + answer + SUFFIX
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    log_p = torch.log_softmax(logits, dim=-1)

    def span(start: int, length: int) -> float:
        return sum(log_p[t - 1, ids[t]].item() for t in range(start, start + length))

    answer_start = len(head) + len(solution) + len(PREFIX)
    return span(len(head), len(solution)), span(answer_start, len(answer))


def _score(model: Qwen2ForCausalLM, max_batch_tokens: int = 32768) -> ExitScores:
    return score_exit_points(
        model,
        PROMPT,
        COMPLETION,
        CUTS,
        SOLUTION,
        ANSWER,
        EXIT,
        PREFIX,
        SUFFIX,
        max_batch_tokens=max_batch_tokens,
    )


def test_batched_scores_match_single_forward(model: Qwen2ForCausalLM) -> None:
    scores = _score(model)
    assert scores.log_p_solution.dtype == torch.float32 and scores.log_p_solution.shape == (len(CUTS),)
    expected = torch.tensor([_reference(model, cut, SOLUTION, ANSWER) for cut in CUTS])
    torch.testing.assert_close(scores.log_p_solution, expected[:, 0], **_tol(model))
    torch.testing.assert_close(scores.log_p_answer, expected[:, 1], **_tol(model))
    # Real log-probabilities: negative, and different between exit points.
    assert (scores.log_p_solution < 0).all() and (scores.log_p_answer < 0).all()
    assert scores.log_p_solution.unique().numel() == len(CUTS)


@pytest.mark.parametrize("max_batch_tokens", [1, 60, 100])
def test_chunking_gives_the_same_numbers(model: Qwen2ForCausalLM, max_batch_tokens: int) -> None:
    full = _score(model)
    chunked = _score(model, max_batch_tokens)
    torch.testing.assert_close(chunked.log_p_solution, full.log_p_solution, **_tol(model))
    torch.testing.assert_close(chunked.log_p_answer, full.log_p_answer, **_tol(model))


def test_reference_pairs(model: Qwen2ForCausalLM) -> None:
    pairs = [(SOLUTION, ANSWER), (_ids(5, 8), _ids(3, 9)), (_ids(12, 10), _ids(1, 11))]
    log_p_solution, log_p_answer = score_reference_pairs(
        model, PROMPT, COMPLETION, CUTS, pairs, EXIT, PREFIX, SUFFIX, max_batch_tokens=150
    )
    assert log_p_solution.shape == log_p_answer.shape == (len(CUTS), len(pairs))
    for j, (solution, answer) in enumerate(pairs):
        expected = torch.tensor([_reference(model, cut, solution, answer) for cut in CUTS])
        torch.testing.assert_close(log_p_solution[:, j], expected[:, 0], **_tol(model))
        torch.testing.assert_close(log_p_answer[:, j], expected[:, 1], **_tol(model))
    # The scores plug straight into the value estimate: one log value per exit point.
    log_values = pr_log_value(log_p_solution, log_p_answer, torch.zeros(len(pairs)), torch.ones(len(pairs)))
    assert log_values.shape == (len(CUTS),) and torch.isfinite(log_values).all()


def test_model_mode_untouched(model: Qwen2ForCausalLM) -> None:
    model.train()
    try:
        _score(model)
        assert model.training
    finally:
        model.eval()


def test_empty_spans_and_bad_cuts(model: Qwen2ForCausalLM) -> None:
    scores = score_exit_points(model, PROMPT, COMPLETION, [0, 5], [], [], EXIT, [], [])
    assert torch.equal(scores.log_p_solution, torch.zeros(2))
    assert torch.equal(scores.log_p_answer, torch.zeros(2))
    with pytest.raises(ValueError):
        score_exit_points(model, PROMPT, COMPLETION, [len(COMPLETION) + 1], SOLUTION, ANSWER, EXIT, [], [])
    with pytest.raises(ValueError):
        score_exit_points(model, [], COMPLETION, [0], SOLUTION, ANSWER, [], [], [])
