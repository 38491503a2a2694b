"""Tests of the attribution study: leave-one-out and gradient norms against direct recomputation,
Monte Carlo segment credit, correlation as a function of the fraction of the trace, Figure 4 files."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
from scipy import stats
from tiny_models import tiny_qwen
from transformers import Qwen2ForCausalLM

from rredcot.infra.stats import MIN_CLUSTERS
from rredcot.lm.modeling import train_tokenizer
from rredcot.method.scoring.types import ExitStrings
from rredcot.studies.attribution import (
    AttrInput,
    attribute,
    differences,
    gradient_norms,
    leave_one_out,
    mc_values,
    segment_rows,
)
from rredcot.studies.figures_attr import (
    STEM,
    VALUE_METHODS,
    VALUE_STEM,
    attribution_figure,
    cluster_interval,
    correlate,
    correlation_by_fraction,
    log10_p,
)

VOCAB = 60


def _model(vocab: int = VOCAB) -> Qwen2ForCausalLM:
    return tiny_qwen(vocab, 0, max_positions=256)


@pytest.fixture(scope="module")
def model() -> Qwen2ForCausalLM:
    return _model()


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(1, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


STRINGS = ExitStrings(_ids(3, 1), _ids(2, 2), _ids(1, 3))
ITEMS = [
    AttrInput(_ids(6, 10), _ids(30, 11), [0, 5, 12, 20, 26], _ids(7, 12), _ids(3, 13)),
    AttrInput(_ids(9, 20), _ids(18, 21), [0, 7, 15], _ids(4, 22), _ids(2, 23)),
    AttrInput(_ids(5, 30), _ids(4, 31), [0], _ids(4, 32), _ids(2, 33)),  # exits at once: no segments
]


def _answer_log_p(model: Qwen2ForCausalLM, head: list[int], item: AttrInput) -> tuple[float, float]:
    """log p(y_ref | u_ref, head) and log p(u_ref | head) with one unpadded forward pass."""
    ids = head + STRINGS.exit_ids + item.solution_ids + STRINGS.answer_prefix_ids
    answer_start = len(ids)
    ids = ids + item.answer_ids + STRINGS.answer_suffix_ids
    with torch.no_grad():
        log_p = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
    sol_start = len(head) + len(STRINGS.exit_ids)
    answer = sum(
        log_p[t - 1, ids[t]].item() for t in range(answer_start, answer_start + len(item.answer_ids))
    )
    solution = sum(log_p[t - 1, ids[t]].item() for t in range(sol_start, sol_start + len(item.solution_ids)))
    return answer, solution


@pytest.mark.numerics
def test_leave_one_out_matches_direct_recomputation(model: Qwen2ForCausalLM) -> None:
    loo = leave_one_out(model, ITEMS, STRINGS, max_batch_tokens=120)  # small budget: several batches
    assert [len(a) for a, _ in loo] == [4, 2, 0]
    assert all(math.isfinite(v) for a, b in loo for v in a + b)
    item, k = ITEMS[0], 2
    think = item.completion_ids[: item.cuts[-1]]
    full_a, full_s = _answer_log_p(model, item.prompt_ids + think, item)
    dropped = think[: item.cuts[k]] + think[item.cuts[k + 1] :]
    drop_a, drop_s = _answer_log_p(model, item.prompt_ids + dropped, item)
    assert loo[0][0][k] == pytest.approx(full_a - drop_a, abs=1e-4)
    assert loo[0][1][k] == pytest.approx(full_a + full_s - drop_a - drop_s, abs=1e-4)


@pytest.mark.numerics
def test_gradient_norms_match_direct_recomputation(model: Qwen2ForCausalLM) -> None:
    grads = gradient_norms(model, ITEMS, STRINGS, max_batch_tokens=4096, objectives=("answer", "value"))
    for objective in ("answer", "value"):  # one padded batch; two backward passes
        assert [len(s) for s, _ in grads[objective]] == [4, 2, 0]
        assert all(math.isfinite(v) and v >= 0 for s, m in grads[objective] for v in s + m)
    item, k = ITEMS[1], 1
    head = item.prompt_ids + item.completion_ids[: item.cuts[-1]] + STRINGS.exit_ids
    ids = head + item.solution_ids + STRINGS.answer_prefix_ids
    answer_start = len(ids)
    ids += item.answer_ids + STRINGS.answer_suffix_ids
    x = model.get_input_embeddings()(torch.tensor([ids])).detach().requires_grad_(True)
    log_p = torch.log_softmax(model(inputs_embeds=x).logits[0].float(), -1)
    answer = sum(log_p[t - 1, ids[t]] for t in range(answer_start, answer_start + len(item.answer_ids)))
    solution = sum(log_p[t - 1, ids[t]] for t in range(len(head), len(head) + len(item.solution_ids)))
    p = len(item.prompt_ids)
    for objective, target in (("answer", answer), ("value", answer + solution)):
        (g,) = torch.autograd.grad(target, x, retain_graph=True)
        norms = g[0, p + item.cuts[k] : p + item.cuts[k + 1]].norm(dim=-1)
        assert grads[objective][1][0][k] == pytest.approx(float(norms.sum()), rel=1e-4)
        assert grads[objective][1][1][k] == pytest.approx(float(norms.mean()), rel=1e-4)


def test_segment_rows_take_mc_differences_and_positions() -> None:
    trace = {
        "trace_id": "t0",
        "problem_id": "p0",
        "level": 3,
        "correct": True,
        "cuts": [0, 4, 10, 20],
        "segment_rewards": [0.5, -1.0, 2.0, 0.1],  # the last one is the answer segment
    }
    mc = mc_values(
        [
            {"trace_id": "t0", "exit_index": j, "mc_value": v, "rollouts": [{}] * 4}
            for j, v in enumerate([0.25, 0.5, None, 1.0])
        ]
    )
    grad = {"answer": ([1.0, 1.0, 1.0], [0.1, 0.1, 0.1])}
    rows = segment_rows(trace, ([1.0, 2.0, 3.0], [0.0, 0.0, 0.0]), grad, mc["t0"])
    assert [r["mc"] for r in rows] == [0.25, None, None]
    assert [r["rredcot"] for r in rows] == [0.5, -1.0, 2.0]
    assert [r["from_right"] for r in rows] == [1.0, 0.8, 0.5]
    assert [r["mc_samples"] for r in rows] == [4, 4, 4]
    assert rows[0]["grad_norm"] == 1.0 and rows[0]["grad_norm_value"] is None
    assert differences([1.0, None, 3.0, 5.0]) == [None, None, 2.0]


def _rows(n: int, seed: int = 0) -> list[dict]:
    """Segments whose b is a monotone function of a; c equals a late in the trace, noise early."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a = rng.gauss(0, 1)
        late = (i % 10) / 10 + 0.05  # from_right in 0.05 … 0.95
        rows.append(
            {
                "trace_id": f"t{i // 5}",
                "problem_id": f"p{i // 10}",
                "from_right": late,
                "mc_samples": 8,
                "rredcot": a,
                "loo": math.exp(a),
                "grad_norm": -(a**3),
                "mc": a if late <= 0.5 else rng.gauss(0, 1),
            }
        )
    return rows


def test_correlation_by_fraction_on_hand_made_data() -> None:
    rows = _rows(200)
    table = correlation_by_fraction(rows, ["rredcot", "loo", "grad_norm", "mc"], [0.3, 0.5, 1.0])
    assert len(table) == 3 * 6
    by = {(t["method_a"], t["method_b"], t["fraction"]): t for t in table}
    for f in (0.3, 0.5, 1.0):
        assert by["rredcot", "loo", f]["spearman"] == pytest.approx(1.0)
        assert by["rredcot", "grad_norm", f]["spearman"] == pytest.approx(-1.0)
        assert by["rredcot", "loo", f]["spearman_log10_p"] == -math.inf
        assert by["rredcot", "loo", f]["n"] == sum(r["from_right"] <= f for r in rows)
    # MC matches RREDCoT only within the last half of the trace: counted from the right.
    assert by["rredcot", "mc", 0.5]["spearman"] == pytest.approx(1.0)
    assert by["rredcot", "mc", 1.0]["spearman"] < 0.9


def _clustered(
    rng: np.random.Generator, problems: int, per: int = 15
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pairs whose problem shares an effect in both values (and one more in y): segments of one problem
    move together, as a trace's segments and a problem's traces do."""
    cluster = np.repeat(np.arange(problems), per)
    shared = rng.normal(size=problems)[cluster]
    x = shared + 0.5 * rng.normal(size=cluster.size)
    y = shared + 0.5 * rng.normal(size=cluster.size) + rng.normal(size=problems)[cluster]
    return x, y, cluster


def test_the_bootstrap_over_problems_covers_what_fisher_misses() -> None:
    """On clustered pairs the Fisher interval (independent pairs) misses the population's ρ most of the
    time; the interval that draws whole problems covers it at about its 95%."""
    from rredcot.infra.stats import fisher_interval

    rng = np.random.default_rng(123)
    x, y, _ = _clustered(rng, 20_000)
    target = stats.spearmanr(x, y).statistic
    boot = fisher = 0
    runs = 40
    for i in range(runs):
        x, y, cluster = _clustered(rng, 30)
        low, high = cluster_interval(x, y, cluster, draws=400, seed=i)
        f_low, f_high = fisher_interval(stats.spearmanr(x, y).statistic, x.size)
        boot += low <= target <= high
        fisher += f_low <= target <= f_high
    assert boot / runs >= 0.85 and fisher / runs <= 0.7


def test_the_bootstrap_over_single_pairs_is_near_fisher() -> None:
    """With one pair a problem (independent pairs) the two intervals agree."""
    from rredcot.infra.stats import fisher_interval

    rng = np.random.default_rng(5)
    x = rng.normal(size=400)
    y = x + rng.normal(size=400)
    low, high = cluster_interval(x, y, [f"p{i}" for i in range(400)])
    f_low, f_high = fisher_interval(stats.spearmanr(x, y).statistic, 400)
    assert low == pytest.approx(f_low, abs=0.03) and high == pytest.approx(f_high, abs=0.03)
    few = [f"p{i % (MIN_CLUSTERS - 1)}" for i in range(400)]
    assert all(math.isnan(v) for v in cluster_interval(x, y, few))


def test_each_correlation_row_carries_its_interval_over_problems() -> None:
    rows = _rows(200)
    table = correlation_by_fraction(rows, ["rredcot", "mc"], [0.5, 1.0])
    for t in table:
        assert t["clusters"] == len(
            {r["problem_id"] for r in rows if r["from_right"] <= t["fraction"] + 1e-9}
        )
        assert t["spearman_low"] <= t["spearman"] <= t["spearman_high"]
    assert table[0]["spearman_low"] == pytest.approx(1.0)  # late MC equals RREDCoT in every resample
    c = correlate([1.0, 2.0, None, 4.0], [2.0, 1.0, 3.0, 5.0], ["a", "b", "c", "d"])
    assert c["n"] == 3 and c["clusters"] == 3 and math.isnan(c["spearman_low"])  # too few problems
    assert "spearman_low" not in correlate([1.0, 2.0, 3.0], [1.0, 3.0, 2.0])


def test_log10_p_agrees_with_scipy() -> None:
    rng = random.Random(1)
    x = [rng.gauss(0, 1) for _ in range(40)]
    y = [v + rng.gauss(0, 2) for v in x]
    c = correlate(x, y)
    assert c["spearman_log10_p"] == pytest.approx(math.log10(stats.spearmanr(x, y).pvalue), abs=1e-6)
    assert c["pearson_log10_p"] == pytest.approx(math.log10(stats.pearsonr(x, y).pvalue), abs=1e-6)
    assert log10_p(0.99, 10_000) < -300  # no underflow to -inf short of |r| = 1
    assert correlate([1.0, 1.0, 1.0, 1.0], [1.0, 2.0, 3.0, 4.0])["n"] == 4  # constant input: NaN, no error


def _trace(tok, i: int, lines: list[str]) -> dict:  # noqa: ANN001
    prompt_ids = tok(f"Problem: Start at {i}, add 2.\n<think>\n")["input_ids"]
    completion_ids, cuts = [], []
    for line in lines:
        cuts.append(len(completion_ids))
        completion_ids += tok(line)["input_ids"]
    exit_at = len(completion_ids)
    completion_ids += tok("</think>\n \\boxed{3}")["input_ids"]
    return {
        "trace_id": f"t{i}",
        "problem_id": f"p{i}",
        "level": 2,
        "correct": i % 2 == 0,
        "prompt": f"Problem: Start at {i}, add 2.\n<think>\n",
        "answer": str((i + 2) % 10),
        "reference": f"{i} + 2 = {(i + 2) % 10}.",
        "prompt_ids": prompt_ids,
        "completion_ids": completion_ids,
        "cuts": [*cuts, exit_at],
        "segment_rewards": [0.1 * i - 0.2 * k for k in range(len(lines))],
    }


def test_attribute_end_to_end_and_figure_files(tmp_path) -> None:  # noqa: ANN001
    lines = ["First, 1 + 2 = 3.\n", "Wait, check it.\n", "So the result is 3.\n"]
    tok = train_tokenizer(
        [f"Problem: Start at {i}, add 2.\n<think>\n" + "".join(lines) for i in range(9)], 120
    )
    lm = _model(len(tok))
    traces = [_trace(tok, i, lines[: 2 + i % 2]) for i in range(6)]
    mc_rows = [
        {"trace_id": t["trace_id"], "exit_index": j, "mc_value": (i + j) % 3 / 2, "rollouts": [{}] * 4}
        for i, t in enumerate(traces)
        for j in range(len(t["cuts"]))
    ]
    prompt_cfg = {"exit_string": "</think>\n", "answer_prefix": " \\boxed{", "answer_suffix": "}"}
    rows, timing = attribute(lm, tok, traces, mc_rows, prompt_cfg, 32768, progress=False)
    assert len(rows) == sum(len(t["cuts"]) - 1 for t in traces)
    assert set(timing) == {"loo_seconds", "grad_seconds"}
    for key in ("rredcot", "loo", "loo_value", "grad_norm", "grad_norm_value", "mc"):
        assert all(r[key] is not None and math.isfinite(r[key]) for r in rows), key
    paths = attribution_figure(rows + _rows(100), tmp_path)
    paths += attribution_figure(rows, tmp_path, VALUE_METHODS, VALUE_STEM)
    assert {p.name for p in paths} == {
        f"{stem}.{ext}" for stem in (STEM, VALUE_STEM) for ext in ("csv", "png", "pdf")
    }
    assert all(p.stat().st_size > 0 for p in paths)
    assert (tmp_path / "fig4_attribution_correlation.png").read_bytes()[:4] == b"\x89PNG"
