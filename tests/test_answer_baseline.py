"""The cached greedy-then-forced loop must equal greedy decoding and teacher forcing done naively."""

from __future__ import annotations

import random

import pytest
import torch
from numerics import log_prob_sum_tol, model_terms
from tiny_models import tiny_llama, tiny_nemotron_h, tiny_qwen, tiny_qwen3_next

from rredcot.method.answer_baseline import greedy_answer_log_probs
from rredcot.method.scoring.types import ScoringBudget

pytestmark = pytest.mark.numerics  # compares two computations (tests/numerics.py)

VOCAB = 53
EOS = 1


MODELS = {
    "qwen2-sdpa": lambda: tiny_qwen(VOCAB, 0, "sdpa"),
    "qwen2-eager": lambda: tiny_qwen(VOCAB, 1, "eager"),
    "llama-sdpa": lambda: tiny_llama(VOCAB, 2),
    # Hybrid caches cannot drop fed tokens: these decode first and teacher-force in a second pass.
    "qwen3-next": lambda: tiny_qwen3_next(VOCAB, 5),
    "nemotron-h": lambda: tiny_nemotron_h(VOCAB, 6),
}


def _stop_at(generated: list[int]) -> int | None:
    """A stand-in for "the answer prefix appeared": after 2-6 tokens (set by the first token), and
    for odd first tokens the prefix "began" one token earlier, so a fed token must be rolled back."""
    length = 2 + generated[0] % 5
    if len(generated) < length:
        return None
    return len(generated) - 1 - generated[0] % 2


def _naive(model, head, answer, prefix, suffix, stop_at, max_new, start=None):
    start = len(head) if start is None else start
    head, generated = head[:start], head[start:]
    with torch.no_grad():
        while True:
            token = int(model(torch.tensor([head + generated])).logits[0, -1].argmax())
            if token == EOS or len(generated) >= max_new:
                break
            generated.append(token)
            cut = stop_at(generated)
            if cut is not None:
                del generated[cut:]
                break
        ids = head + generated + prefix + answer + suffix
        log_p = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
    start = len(head) + len(generated) + len(prefix)
    total = sum(float(log_p[start + j - 1, t]) for j, t in enumerate(answer))
    return total, generated


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("budget", [None, ScoringBudget(max_batch_tokens=80, max_logit_elements=2 * VOCAB)])
@pytest.mark.parametrize("drafts", [None, "random", "right"])
def test_greedy_baseline_matches_naive_decoding_and_teacher_forcing(name, seed, budget, drafts):
    """Also under a budget that splits the rows into several groups and the logits into 2-row chunks,
    and with drafts that greedy decoding never follows, or follows to the end (every step then keeps
    several tokens): the result is greedy decoding either way."""
    model = MODELS[name]()
    rng = random.Random(seed)
    heads = [[rng.randrange(2, VOCAB) for _ in range(rng.randrange(1, 30))] for _ in range(8)]
    answers = [[rng.randrange(2, VOCAB) for _ in range(rng.randrange(1, 4))] for _ in heads]
    # Some solutions begin inside the head (up to 3 known tokens): those count towards the stop and
    # the length limit, and a stop may roll back into them.
    starts = [max(1, len(h) - rng.randrange(0, 4)) for h in heads]
    prefix, suffix, max_new = [7, 8], [9], 9
    stop_at = _stop_at if drafts is None else _late_stop_at
    want = [
        _naive(model, head, answer, prefix, suffix, stop_at, max_new, start)
        for head, answer, start in zip(heads, answers, starts, strict=True)
    ]
    given = None
    if drafts == "random":
        given = [[rng.randrange(2, VOCAB) for _ in range(12)] for _ in heads]
    elif drafts == "right":  # the naive greedy solution after its first decoded token
        given = [[*_greedy_tokens(model, head, 12)[1:]] for head in heads]
    got, solutions = greedy_answer_log_probs(
        model,
        heads,
        answers,
        prefix,
        suffix,
        stop_at,
        [EOS],
        max_new,
        solution_starts=starts,
        budget=budget,
        drafts=given,
    )
    # Sequences of at most head 29 + solution 9 + prefix 2 + answer 3 + suffix 1 tokens; the answer's
    # at most 3 tokens scored (tests/numerics.py).
    tol = log_prob_sum_tol(model_terms(model, 44), 3)
    for b, (log_p, solution) in enumerate(want):
        assert solutions[b] == solution
        assert float(got[b]) == pytest.approx(log_p, abs=tol["atol"], rel=tol["rtol"])


def _late_stop_at(generated: list[int]) -> int | None:
    """Like ``_stop_at``, after 5-9 tokens, so that drafts have steps to save."""
    length = 5 + generated[0] % 5
    if len(generated) < length:
        return None
    return len(generated) - 1 - generated[0] % 2


def _greedy_tokens(model, head: list[int], n: int) -> list[int]:
    """The first ``n`` tokens greedy decoding writes after ``head``."""
    out: list[int] = []
    with torch.no_grad():
        for _ in range(n):
            out.append(int(model(torch.tensor([head + out])).logits[0, -1].argmax()))
    return out


def test_eos_and_length_limit_end_the_solution():
    model = tiny_qwen(VOCAB, 3)
    head = [5, 6, 7]
    with torch.no_grad():
        first = int(model(torch.tensor([head])).logits[0, -1].argmax())
    # The first greedy token is declared EOS: the solution is empty and the answer follows the head.
    got, solutions = greedy_answer_log_probs(model, [head], [[11]], [7], [], lambda g: None, [first], 4)
    assert solutions == [[]]
    with torch.no_grad():
        log_p = torch.log_softmax(model(torch.tensor([head + [7, 11]])).logits[0], dim=-1)
    tol = log_prob_sum_tol(model_terms(model, 5), 1)  # head 3 + prefix 1 + answer 1 tokens, 1 scored
    assert float(got[0]) == pytest.approx(float(log_p[len(head), 11]), abs=tol["atol"], rel=tol["rtol"])
    # Without a stop or EOS it writes exactly max_new_tokens.
    _, solutions = greedy_answer_log_probs(model, [head], [[11]], [7], [], lambda g: None, [], 6)
    assert len(solutions[0]) == 6


def test_rejects_mismatched_inputs():
    model = tiny_qwen(VOCAB, 4)
    with pytest.raises(ValueError, match="heads"):
        greedy_answer_log_probs(model, [[1, 2]], [], [7], [], lambda g: None, [EOS], 3)
    with pytest.raises(ValueError, match="answer_prefix_ids"):
        greedy_answer_log_probs(model, [[1, 2]], [[3]], [], [], lambda g: None, [EOS], 3)
    with pytest.raises(ValueError, match="at least one token"):
        greedy_answer_log_probs(model, [[]], [[3]], [7], [], lambda g: None, [EOS], 3)
