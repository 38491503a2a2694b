"""Under autocast the credit passes cast the decoder's linear weights once, not once per call.

With float32 master weights and bf16 autocast (the paper recipes), every linear layer casts its
weight in each call; the greedy answer baseline makes one call per layer and decoded token, so those
casts were a large share of its time on a GPU. ``forward.low_precision_linears`` casts them once for
the block. These tests check, on a CPU (bf16 autocast behaves the same there), that the results stay
bit for bit those of plain autocast, that the float32 weights come back untouched, and that inside
the block no linear weight is cast again.
"""

from __future__ import annotations

import torch
from tiny_models import tiny_qwen
from torch.profiler import ProfilerActivity, profile

from rredcot.method.answer_baseline import greedy_answer_log_probs
from rredcot.method.forward import low_precision_linears

VOCAB = 61
EOS = 2


def _baseline(model: torch.nn.Module) -> tuple[torch.Tensor, list[list[int]]]:
    heads = [[1, 9, 12, 30, 3, 4], [1, 17, 3, 4], [1, 22, 40, 41, 42, 3, 4]]
    return greedy_answer_log_probs(model, heads, [[11], [13, 14], [15]], [7], [8], lambda g: None, [EOS], 12)


def _weight_casts(prof: profile, shapes: set[tuple[int, ...]]) -> int:
    """``aten::_to_copy`` calls whose input has the shape of a linear weight."""
    return sum(
        e.count
        for e in prof.key_averages(group_by_input_shape=True)
        if e.key == "aten::_to_copy" and e.input_shapes and tuple(e.input_shapes[0]) in shapes
    )


def test_same_results_as_autocast_and_weights_restored():
    model = tiny_qwen(VOCAB, 3)
    before = {n: (p.data_ptr(), p.dtype, p.detach().clone()) for n, p in model.named_parameters()}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = _baseline(model)
        with low_precision_linears(model) as cast:
            inside = [p.dtype for p in model.get_decoder().layers[0].mlp.parameters()]
            once = _baseline(model)
    assert cast > 0
    assert inside and all(d == torch.bfloat16 for d in inside)
    assert torch.equal(plain[0], once[0]) and plain[1] == once[1]
    for name, p in model.named_parameters():
        ptr, dtype, value = before[name]
        assert p.data_ptr() == ptr and p.dtype == dtype and torch.equal(p, value), name


def test_no_linear_weight_is_cast_inside_the_block():
    model = tiny_qwen(VOCAB, 4)
    shapes = {tuple(m.weight.shape) for m in model.get_decoder().modules() if isinstance(m, torch.nn.Linear)}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as plain:
            _baseline(model)
        with low_precision_linears(model):
            with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as once:
                _baseline(model)
    # Plain autocast casts every linear weight in every decoder call; inside the block none is.
    assert _weight_casts(plain, shapes) > 10 * len(shapes)
    assert _weight_casts(once, shapes) == 0


def test_nothing_happens_without_autocast_or_in_float32():
    model = tiny_qwen(VOCAB, 5)
    with low_precision_linears(model) as cast:
        assert cast == 0
        assert all(p.dtype == torch.float32 for p in model.parameters())
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.autocast("cpu", enabled=False):
        with low_precision_linears(model) as cast:
            assert cast == 0


def test_weights_come_back_after_an_error():
    model = tiny_qwen(VOCAB, 6)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16), low_precision_linears(model):
            raise RuntimeError("a pass failed")
    except RuntimeError:
        pass
    assert all(p.dtype == torch.float32 for p in model.parameters())
