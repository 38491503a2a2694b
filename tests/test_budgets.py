"""Every credit pass keeps to its ``ScoringBudget``: tokens per forward pass and logits per head call.

A forward hook on the decoder records what each call holds (rows x (cached + new tokens)); the LM
head helper is wrapped to record how many positions get vocabulary logits at once. Each pass runs
under a small budget on traces longer than it, and must split its work accordingly (a single row
longer than the budget runs alone, as the budget documents).
"""

from __future__ import annotations

import random

import pytest
import torch
from tiny_models import tiny_qwen

import rredcot.method.forward as F
from rredcot.method.answer_baseline import greedy_answer_log_probs
from rredcot.method.scoring.entropies import completion_entropies
from rredcot.method.scoring.naive import score_traces_naive
from rredcot.method.scoring.single_pass import score_traces_single_pass
from rredcot.method.scoring.types import ExitStrings, ScoringBudget, TraceExits

VOCAB = 61
BUDGET = ScoringBudget(max_batch_tokens=300, max_mask_elements=40_000, max_logit_elements=5 * VOCAB)
STRINGS = ExitStrings([3, 4], [5], [6])


def _traces(n: int = 6) -> list[TraceExits]:
    rng = random.Random(0)
    out = []
    for i in range(n):
        length = 60 + 25 * i
        completion = [rng.randrange(7, VOCAB) for _ in range(length)]
        cuts = list(range(0, length, 12)) + [length]
        out.append(TraceExits([1, 2, 7 + i], completion, cuts, [([8, 9, 10, 11], [12])], length - 4))
    return out


@pytest.fixture
def recorded(monkeypatch):
    model = tiny_qwen(VOCAB, 0, "sdpa", max_positions=1024)
    calls, heads = [], []

    def hook(module, args, kwargs):  # noqa: ANN001
        ids = kwargs["input_ids"]
        cache = kwargs.get("past_key_values")
        cached = cache.get_seq_length() if cache is not None else 0
        calls.append((ids.shape[0], cached + ids.shape[1]))

    model.get_decoder().register_forward_pre_hook(hook, with_kwargs=True)
    real = F.LogitHead.logits

    def head(self, hidden):  # noqa: ANN001
        heads.append(hidden.shape[0])
        return real(self, hidden)

    monkeypatch.setattr(F.LogitHead, "logits", head)
    return model, calls, heads


def _check(calls: list[tuple[int, int]], heads: list[int]) -> None:
    assert calls and heads
    for rows, width in calls:
        assert rows == 1 or rows * width <= BUDGET.max_batch_tokens, (rows, width)
    assert max(heads) * VOCAB <= BUDGET.max_logit_elements


def test_single_pass_scoring_keeps_to_the_budget(recorded):
    model, calls, heads = recorded
    with torch.inference_mode():
        score_traces_single_pass(model, _traces(), STRINGS, BUDGET)
    _check(calls, heads)
    assert len(calls) > 6  # the work was split into many passes


def test_naive_scoring_and_entropies_keep_to_the_budget(recorded):
    model, calls, heads = recorded
    traces = _traces()
    score_traces_naive(model, traces, STRINGS, BUDGET)
    completion_entropies(model, [(t.prompt_ids, t.completion_ids) for t in traces], BUDGET)
    _check(calls, heads)


def test_greedy_baseline_keeps_to_the_budget(recorded):
    model, calls, heads = recorded
    traces = _traces()
    heads_ids = [[*t.prompt_ids, *t.completion_ids[:-10]] for t in traces]
    greedy_answer_log_probs(
        model, heads_ids, [[12]] * len(traces), [5], [6], lambda s: None, [1], 8, budget=BUDGET
    )
    _check(calls, heads)
    assert len({rows for rows, _ in calls}) > 1 or max(rows for rows, _ in calls) < len(traces)
