"""The credit passes keep their work on the device: a CPU guard for what stalls a GPU.

On a GPU every read of a device value on the host (``.item()``, ``.tolist()``, ``.cpu()``, ``int(t)``,
``if t:``) waits for all queued work, and a loop over tokens launches a kernel per token. Neither
shows on a CPU, so these tests make it visible: a torch-function mode follows which tensors live "on
the device" (made with ``device=``, moved there with ``.to(device)``, or computed from such tensors)
and counts every host read of one, and every torch call. Then, per pass on a tiny model:

- host reads happen only in ``forward.to_host``, a fixed number of times per pass;
- the number of decoder calls is what the budget implies;
- the number of torch calls does not grow with the number of tokens (no per-token loop).

Breaking any of these (a ``.cpu()`` per logit chunk, an ``int(argmax)`` per row, a Python loop that
fills the tree mask token by token) fails here.
"""

from __future__ import annotations

import random
from contextlib import contextmanager

import pytest
import torch
from tiny_models import tiny_qwen
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

import rredcot.method.answer_baseline as AB
import rredcot.method.forward as F
import rredcot.method.scoring.entropies as ENT
import rredcot.method.scoring.naive as NAIVE
import rredcot.method.scoring.single_pass as PS
from rredcot.method.answer_baseline import greedy_answer_log_probs
from rredcot.method.scoring.naive import score_traces_naive
from rredcot.method.scoring.single_pass import score_traces_single_pass
from rredcot.method.scoring.types import ExitStrings, ScoringBudget, TraceExits

VOCAB = 61
STRINGS = ExitStrings([3, 4], [5], [6])
HOST_READS = {"item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__"}
FACTORIES = {"zeros", "ones", "full", "empty", "arange", "tensor", "as_tensor", "zeros_like", "full_like"}


class DeviceTracker(TorchFunctionMode):
    """Marks tensors that would live on a GPU and counts host reads of them and torch calls."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []  # host reads outside to_host
        self.calls = 0
        self.allowed = False  # inside to_host

    @staticmethod
    def on_device(t: object) -> bool:
        return isinstance(t, torch.Tensor) and getattr(t, "_on_device", False)

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        self.calls += 1
        inputs = tree_leaves((args, kwargs))
        from_device = any(self.on_device(t) for t in inputs)
        to = None
        if name == "to":
            targets = (*args[1:], kwargs.get("device"))
            to = next((a for a in targets if isinstance(a, str | torch.device)), None)
        if from_device and (name in HOST_READS or to is not None):
            if not self.allowed:
                self.reads.append(name)
            out = func(*args, **kwargs)  # on the host now
            return out
        out = func(*args, **kwargs)
        made_there = name in FACTORIES and kwargs.get("device") is not None
        if from_device or made_there or to is not None:
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    t._on_device = True
        return out


@contextmanager
def tracked(monkeypatch):
    """The mode, with ``to_host`` (the one sanctioned host read) counted in every module that uses it."""
    mode = DeviceTracker()
    transfers: list[int] = []
    for module in (NAIVE, ENT, PS, AB):

        def counted(*tensors, real=F.to_host):  # noqa: ANN002, ANN202
            transfers.append(len(tensors))
            mode.allowed = True
            try:
                # On a CPU the "transfer" returns the same tensors: copies stand for the host's.
                out = [t.clone() for t in real(*tensors)]
            finally:
                mode.allowed = False
            for t in out:
                t._on_device = False
            return out

        monkeypatch.setattr(module, "to_host", counted)
    with mode:
        yield mode, transfers


@pytest.fixture
def model():
    m = tiny_qwen(VOCAB, 0, "sdpa", max_positions=2048)
    calls: list[int] = []
    m.get_decoder().register_forward_pre_hook(lambda *_: calls.append(1))
    m.decoder_calls = calls
    return m


def _traces(length: int, n: int = 4, cuts: int = 6) -> list[TraceExits]:
    rng = random.Random(0)
    out = []
    for i in range(n):
        completion = [rng.randrange(7, VOCAB) for _ in range(length + 3 * i)]
        at = sorted({round(k * len(completion) / (cuts - 1)) for k in range(cuts)})
        pairs = [([rng.randrange(7, VOCAB) for _ in range(length // 8)], [rng.randrange(7, VOCAB)])]
        out.append(TraceExits([1, 2, 7 + i], completion, at, pairs, len(completion) - 2))
    return out


def _run(model, monkeypatch, fn) -> tuple[list[str], list[int], int, int]:
    model.decoder_calls.clear()
    with tracked(monkeypatch) as (mode, transfers), torch.inference_mode():
        fn()
    return mode.reads, transfers, len(model.decoder_calls), mode.calls


BIG = ScoringBudget(max_batch_tokens=1 << 20, max_mask_elements=1 << 26)


def test_single_pass_scoring_reads_the_host_once_per_trace_pass(model, monkeypatch):
    short = _run(model, monkeypatch, lambda: score_traces_single_pass(model, _traces(40), STRINGS, BIG))
    long = _run(model, monkeypatch, lambda: score_traces_single_pass(model, _traces(160), STRINGS, BIG))
    for reads, transfers, decoder_calls, _ in (short, long):
        assert reads == []  # nothing reads a device value but to_host
        # One trace pass (entropies for segmentation, one read), then the sums once at the end.
        assert len(transfers) == 2
        assert decoder_calls >= 2
    # Four times the tokens, the same passes and the same torch calls: no loop over tokens.
    assert long[2] == short[2]
    assert long[3] == short[3]


def test_naive_scoring_and_entropies_read_the_host_once_each(model, monkeypatch):
    short = _run(model, monkeypatch, lambda: score_traces_naive(model, _traces(40), STRINGS, BIG))
    long = _run(model, monkeypatch, lambda: score_traces_naive(model, _traces(160), STRINGS, BIG))
    for reads, transfers, _, _ in (short, long):
        assert reads == [] and len(transfers) == 2  # entropies, then the scores
    assert long[2:] == short[2:]


@pytest.mark.parametrize("block", [1, 4])
def test_greedy_baseline_reads_the_host_once_per_block(model, monkeypatch, block):
    heads = [[1, 2, *range(7, 7 + 20 + 3 * b)] for b in range(4)]
    answers = [[9, 10]] * 4

    def decode(max_new: int):  # noqa: ANN202
        return lambda: greedy_answer_log_probs(
            model, heads, answers, [5], [6], lambda s: None, [], max_new, budget=BIG, block=block
        )

    few = _run(model, monkeypatch, decode(8))
    many = _run(model, monkeypatch, decode(16))
    for (reads, transfers, decoder_calls, _), max_new in ((few, 8), (many, 16)):
        assert reads == []
        steps = decoder_calls - 1  # after the prefill, one decoder call per step
        # Without drafts every row decodes one token a step, max_new + 1 of them (the last shows the
        # limit), which the host sees at the end of that block; then one step feeds the forced
        # tokens up to the last answer token's predecessor (prefix and first answer token).
        looks = -(-(max_new + 1) // block)
        assert steps == looks * block + 1
        assert len(transfers) == looks + 1  # one look per block, the sums at the end
