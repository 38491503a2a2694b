"""Single-pass exit scoring must reproduce the naive per-exit-point scoring (float32 round-off)."""

from __future__ import annotations

import random

import pytest
import torch
from numerics import decoder_terms, entropy_tol, log_prob_sum_tol
from tiny_models import tiny_llama, tiny_qwen

from rredcot.method.scoring.entropies import completion_entropies
from rredcot.method.scoring.naive import score_traces_naive
from rredcot.method.scoring.single_pass import score_traces_single_pass, supports_single_pass
from rredcot.method.scoring.types import ExitStrings, ScoringBudget, TraceExits

pytestmark = pytest.mark.numerics  # compares two computations (tests/numerics.py)

VOCAB = 61
# Tolerances of the largest of MODELS (llama: 3 layers, hidden 48, MLP 96) over sequences of at most
# 93 tokens (prompt 14, completion 59, exit 3, solution 11, answer 3 and the texts around it 3); a sum
# scores at most 11 tokens (tests/numerics.py).
TERMS = decoder_terms(layers=3, seq_len=93, hidden=48, intermediate=96, vocab=VOCAB)
LOG_P = log_prob_sum_tol(TERMS, n_scored=11)
ENTROPY = entropy_tol(TERMS, VOCAB)


MODELS = {
    "qwen2-sdpa": lambda: tiny_qwen(VOCAB, 0, "sdpa"),
    "qwen2-eager": lambda: tiny_qwen(VOCAB, 1, "eager"),
    "llama-sdpa": lambda: tiny_llama(VOCAB, 2),
}


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1, VOCAB) for _ in range(n)]


def _random_traces(seed: int, n_traces: int = 4, n_pairs: int = 2) -> list[TraceExits]:
    """Traces of different lengths with random cuts that always include 0 and the last position."""
    rng = random.Random(seed)
    traces = []
    for _ in range(n_traces):
        completion = _ids(rng, rng.randrange(1, 60))
        inner = rng.sample(range(1, len(completion)), k=min(len(completion) - 1, rng.randrange(0, 8)))
        cuts = sorted({0, len(completion), *inner})
        pairs = [(_ids(rng, rng.randrange(0, 12)), _ids(rng, rng.randrange(1, 4))) for _ in range(n_pairs)]
        # Half the traces also score the first answer after their own solution, at any position.
        own = rng.randrange(0, len(completion) + 1) if rng.random() < 0.5 else None
        traces.append(TraceExits(_ids(rng, rng.randrange(1, 15)), completion, cuts, pairs, own))
    return traces


def _strings(seed: int, exit_len: int = 3) -> ExitStrings:
    rng = random.Random(seed)
    return ExitStrings(_ids(rng, exit_len), _ids(rng, 2), _ids(rng, 1))


def _assert_same(single: list, naive: list) -> float:
    worst = 0.0
    for a, b in zip(single, naive, strict=True):
        assert a.cuts == b.cuts
        assert a.log_p_solution.shape == b.log_p_solution.shape and a.log_p_solution.dtype == torch.float32
        for x, y in ((a.log_p_solution, b.log_p_solution), (a.log_p_answer, b.log_p_answer)):
            torch.testing.assert_close(x, y, **LOG_P)
            worst = max(worst, float((x - y).abs().max()) if x.numel() else 0.0)
        torch.testing.assert_close(a.entropies, b.entropies, atol=ENTROPY, rtol=0)
        # The most likely token at each completion position (the greedy baseline's shortcut).
        assert a.greedy_ids.dtype == torch.long and torch.equal(a.greedy_ids, b.greedy_ids)
        assert (a.log_p_own_answer is None) == (b.log_p_own_answer is None)
        if a.log_p_own_answer is not None:
            torch.testing.assert_close(a.log_p_own_answer, b.log_p_own_answer, **LOG_P)
            assert float(a.log_p_own_answer) < 0
            worst = max(worst, float((a.log_p_own_answer - b.log_p_own_answer).abs()))
    return worst


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_single_pass_matches_naive(name: str, seed: int) -> None:
    model = MODELS[name]()
    assert supports_single_pass(model)
    traces, strings = _random_traces(seed), _strings(seed)
    single = score_traces_single_pass(model, traces, strings)
    naive = score_traces_naive(model, traces, strings)
    _assert_same(single, naive)
    # Real numbers: negative log-probs that differ between exit points.
    long = max(single, key=lambda s: len(s.cuts))
    assert (long.log_p_answer < 0).all() and long.log_p_answer[:, 0].unique().numel() > 1


@pytest.mark.parametrize(
    "budget",
    [
        ScoringBudget(max_batch_tokens=1, max_mask_elements=1, max_logit_elements=1),
        ScoringBudget(max_batch_tokens=90, max_mask_elements=20_000, max_logit_elements=200),
        ScoringBudget(max_batch_tokens=400, max_mask_elements=1 << 30, max_logit_elements=VOCAB * 7),
    ],
)
def test_budgets_only_change_the_chunking(budget: ScoringBudget) -> None:
    model = MODELS["qwen2-sdpa"]()
    traces, strings = _random_traces(7, n_traces=5, n_pairs=3), _strings(7)
    _assert_same(
        score_traces_single_pass(model, traces, strings, budget), score_traces_naive(model, traces, strings)
    )


def test_empty_exit_string_empty_spans_and_empty_prompt() -> None:
    model = MODELS["qwen2-eager"]()
    rng = random.Random(3)
    completion = _ids(rng, 20)
    traces = [
        # Empty prompt: cut 0 has no prefix token and is rejected, cuts >= 1 work.
        TraceExits([], completion, [1, 5, 20], [(_ids(rng, 4), _ids(rng, 2))]),
        # Empty solution span: log p(u|s) is exactly 0.
        TraceExits(_ids(rng, 5), completion, [0, 20], [([], _ids(rng, 2))]),
    ]
    strings = ExitStrings([], [], [])
    single = score_traces_single_pass(model, traces, strings)
    _assert_same(single, score_traces_naive(model, traces, strings))
    assert torch.equal(single[1].log_p_solution, torch.zeros(2, 1))
    with pytest.raises(ValueError, match="empty"):
        score_traces_single_pass(model, [TraceExits([], completion, [0], [([1], [2])])], strings)
    with pytest.raises(ValueError, match="outside"):
        score_traces_single_pass(model, [TraceExits([1], completion, [21], [([1], [2])])], strings)


def test_cuts_chosen_from_the_trace_pass_entropies() -> None:
    model = MODELS["qwen2-sdpa"]()
    traces = [TraceExits(t.prompt_ids, t.completion_ids, None, t.pairs) for t in _random_traces(5)]
    seen: dict[int, torch.Tensor] = {}

    def cuts_for(i: int, entropies: torch.Tensor) -> list[int]:
        seen[i] = entropies
        # Cut before the three most uncertain tokens, plus 0 and the end.
        top = entropies.topk(min(3, entropies.numel())).indices.tolist()
        return sorted({0, len(traces[i].completion_ids), *top})

    single = score_traces_single_pass(model, traces, _strings(5), cuts_for=cuts_for)
    naive = score_traces_naive(model, traces, _strings(5), cuts_for=cuts_for)
    _assert_same(single, naive)
    reference = completion_entropies(model, [(t.prompt_ids, t.completion_ids) for t in traces])
    for i, trace in enumerate(traces):
        assert seen[i].shape == (len(trace.completion_ids),)
        torch.testing.assert_close(seen[i], reference[i], atol=ENTROPY, rtol=0)
        assert (seen[i] >= 0).all() and (seen[i] <= torch.log2(torch.tensor(float(VOCAB))) + ENTROPY).all()
    with pytest.raises(ValueError, match="cuts_for"):
        score_traces_single_pass(model, traces, _strings(5))


def test_model_mode_untouched_and_flash_attention_refused() -> None:
    model = MODELS["qwen2-sdpa"]()
    model.train()
    traces = _random_traces(1, n_traces=1)
    score_traces_single_pass(model, traces, _strings(1))
    assert model.training
    model.config._attn_implementation = "flash_attention_2"
    assert not supports_single_pass(model)
    with pytest.raises(ValueError, match="eager"):
        score_traces_single_pass(model, traces, _strings(1))


def test_repeated_traces_and_shared_prefixes_are_scored_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sampled group repeats itself: the copies get the scores of one run, equal to naive scoring."""
    import rredcot.method.scoring.single_pass as P

    model = MODELS["qwen2-sdpa"]()
    rng = random.Random(11)
    prompt, other_prompt = _ids(rng, 6), _ids(rng, 7)
    a = _ids(rng, 30)
    b = a[:12] + _ids(rng, 18)  # shares a's first 12 completion tokens
    pairs = [(_ids(rng, 5), _ids(rng, 2))]
    traces = [
        TraceExits(prompt, a, [0, 6, 12, 30], pairs, 25),
        TraceExits(prompt, a, [0, 6, 12, 30], pairs, 25),  # the same trace again
        TraceExits(prompt, b, [0, 6, 12, 20, 30], pairs, 28),  # cuts 0, 6, 12 read a's prefixes
        TraceExits(other_prompt, a, [0, 6], pairs),  # same completion, other prompt: nothing shared
        TraceExits(
            prompt, a, [0, 6, 12, 30], [(_ids(rng, 4), _ids(rng, 2))]
        ),  # other pair: same trace pass, own suffixes
    ]
    trace_rows: list[int] = []
    suffix_jobs: list = []
    run_trace, run_suffix = P._run_trace_pass, P._run_suffix_pass

    def spy_trace(model, head, traces, rows):
        trace_rows.extend(rows)
        return run_trace(model, head, traces, rows)

    def spy_suffix(model, head, chunk, packed, flat, slot):
        suffix_jobs.extend(job for row in packed for job in row)
        return run_suffix(model, head, chunk, packed, flat, slot)

    monkeypatch.setattr(P, "_run_trace_pass", spy_trace)
    monkeypatch.setattr(P, "_run_suffix_pass", spy_suffix)
    strings = _strings(11)
    single = score_traces_single_pass(model, traces, strings)
    _assert_same(single, score_traces_naive(model, traces, strings))
    assert sorted(trace_rows) == [0, 2, 3]  # traces 1 and 4 read the pass of trace 0
    # Distinct suffixes: trace 0: 4 cuts + own answer; trace 2: cuts 20, 30 + own answer (its cuts
    # 0, 6, 12 are trace 0's); trace 3: 2 cuts; trace 4: 4 cuts with its own pair, own answer none.
    assert len(suffix_jobs) == 5 + 3 + 2 + 4
    assert torch.equal(single[1].log_p_solution, single[0].log_p_solution)
    assert torch.equal(single[2].log_p_answer[:3], single[0].log_p_answer[:3])  # copies of one run
