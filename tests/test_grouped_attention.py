"""Grouped-query attention under a mask reads each key/value head in place: the same attention as
transformers' SDPA path, without its copy of the cache for every query head."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from numerics import attention_tol, log_prob_sum_tol, model_terms
from tiny_models import tiny_llama, tiny_qwen
from transformers.integrations import sdpa_attention
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from rredcot.method.answer_baseline import greedy_answer_log_probs
from rredcot.method.forward import grouped_attention, grouped_sdpa

pytestmark = pytest.mark.numerics  # compares two computations (tests/numerics.py)


class _Attention(torch.nn.Module):
    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


@settings(max_examples=40, deadline=None)
@given(
    kv_heads=st.integers(1, 3),
    groups=st.integers(1, 4),
    queries=st.integers(1, 9),
    keys=st.integers(1, 24),
    per_head=st.booleans(),
    shared_rows=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_grouped_sdpa_is_transformers_sdpa(kv_heads, groups, queries, keys, per_head, shared_rows, seed):
    """Masks as transformers passes them: one for all heads or one per head, per row or shared by
    the rows; every row keeps at least one key (a query that reads no key has no defined output)."""
    g = torch.Generator().manual_seed(seed)
    b, d, heads = 2, 8, kv_heads * groups
    query = torch.randn(b, heads, queries, d, generator=g)
    key, value = (torch.randn(b, kv_heads, keys, d, generator=g) for _ in range(2))
    allowed = torch.rand(1 if shared_rows else b, heads if per_head else 1, queries, keys, generator=g) < 0.6
    allowed[..., 0] = True
    mask = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    module = _Attention(groups)
    got, _ = grouped_sdpa(module, query, key, value, mask, scaling=d**-0.5)
    want, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=d**-0.5)
    assert got.shape == want.shape == (b, queries, heads, d)
    torch.testing.assert_close(got, want, atol=attention_tol(query, key, value, d**-0.5), rtol=0)


@pytest.mark.parametrize("make", [lambda: tiny_qwen(53, 0, "sdpa"), lambda: tiny_llama(53, 2)])
def test_greedy_baseline_reads_the_cache_in_place(make, monkeypatch):
    """The decoding steps (4 queries per row over the whole cache, under a 4D mask) copy no key or
    value head, write what eager attention writes, and leave the model's attention as it was."""
    copies = []

    def counted(hidden, n_rep):
        copies.append(hidden.shape)
        return repeat_kv(hidden, n_rep)

    repeat_kv = sdpa_attention.repeat_kv
    monkeypatch.setattr(sdpa_attention, "repeat_kv", counted)
    model = make()
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    rng = random.Random(0)
    heads = [[rng.randrange(2, 53) for _ in range(rng.randrange(8, 40))] for _ in range(6)]
    answers = [[rng.randrange(2, 53) for _ in range(2)] for _ in heads]
    args = (heads, answers, [7, 8], [9], lambda s: len(s) - 1 if len(s) >= 12 else None, [1], 12)
    with torch.inference_mode():
        got, solutions = greedy_answer_log_probs(model, *args)
    assert copies == [] and model.config._attn_implementation == "sdpa"
    with torch.inference_mode(), grouped_attention(False):  # transformers' own path copies them
        plain, plain_solutions = greedy_answer_log_probs(model, *args)
    assert copies and plain_solutions == solutions
    # Sequences of at most head 39 + solution 12 + answer prefix, answer and suffix 5 tokens; the
    # answer's 2 tokens scored (tests/numerics.py).
    tol = log_prob_sum_tol(model_terms(model, 56), 2)
    torch.testing.assert_close(got, plain, **tol)
    model.config._attn_implementation = "eager"
    with torch.inference_mode():
        want, reference = greedy_answer_log_probs(model, *args)
    assert solutions == reference
    torch.testing.assert_close(got, want, **tol)
