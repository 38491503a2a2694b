"""GPU check: the paper-scale credit passes and training step on randomly initialised models of real shapes.

Nothing is downloaded: the models are Qwen2/Qwen3 architectures built from their published sizes
(Qwen2.5-0.5B, R1-Distill-Qwen-1.5B = Qwen2.5-1.5B, Qwen3-4B) with random weights; cost and memory do
not depend on the weights. It measures

1. **single-pass scoring** of one trace of 8k, 16k and 25k tokens with 48 exit points: peak GPU
   memory, time, the ratio to one plain forward pass over the trace, and the attention kernel SDPA
   picked (from the profiler's op names: flash, efficient, cuDNN or math);
2. **bf16 vs fp32 σ**: σ·|o| of the same traces scored under bf16 autocast and in float32;
3. **three RREDCoTTrainer steps** on CUDA (bf16 autocast, float32 master weights) with the smallest
   model: step times and peak memory;
4. **the TRL micro-batch**: forward and backward of the policy log-probabilities of one completion of
   8k-25k tokens with gradient checkpointing, through TRL's fused LM head: peak memory.

    rredcot gpu-check --out results/bench/gpu.json              # on a CUDA machine
    rredcot gpu-check --device cpu --tiny --out /tmp/gpu.json   # the same code paths, tiny, on a CPU

Every section catches its own out-of-memory error and reports it, so one failure does not hide the
rest. The tests run the ``--tiny`` CPU form; they never need a GPU.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rredcot.infra.logs import setup_logging
from rredcot.infra.memory import PeakRSS

_log = logging.getLogger(__name__)

# Published sizes (config.json of each checkpoint); vocabulary 151,936 for all three.
SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": dict(
        model_type="qwen2",
        hidden_size=896,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        intermediate_size=4864,
        tie_word_embeddings=True,
    ),
    "qwen2.5-1.5b": dict(
        model_type="qwen2",
        hidden_size=1536,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        intermediate_size=8960,
        tie_word_embeddings=False,
    ),
    "qwen3-4b": dict(
        model_type="qwen3",
        hidden_size=2560,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=9728,
        tie_word_embeddings=True,
    ),
}
TINY = dict(
    model_type="qwen3",
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=128,
    tie_word_embeddings=True,
)
VOCAB = 151936


def build(shape: dict[str, Any], vocab: int, max_len: int, device: torch.device, dtype: torch.dtype):
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = dict(shape)
    config = AutoConfig.for_model(
        spec.pop("model_type"), vocab_size=vocab, max_position_embeddings=max_len + 4096, **spec
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


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


def _guarded(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    try:
        return fn()
    except torch.OutOfMemoryError as exc:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return {"error": f"out of memory: {str(exc).splitlines()[0]}"}


def _trace(vocab: int, length: int, exits: int, seed: int) -> Any:
    import random

    from rredcot.method.exit_scoring import TraceExits

    rng = random.Random(seed)
    prompt = [rng.randrange(10, vocab) for _ in range(200)]
    completion = [rng.randrange(10, vocab) for _ in range(length)]
    cuts = sorted({min(length, round(i * length / exits)) for i in range(exits + 1)})
    solution = [rng.randrange(10, vocab) for _ in range(400)]
    return TraceExits(prompt, completion, cuts, [(solution, [rng.randrange(10, vocab)])], length - 8)


def _sdpa_kernels(fn: Callable[[], Any]) -> dict[str, int]:
    """Which scaled-dot-product-attention implementation ran, by the profiler's op names."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        fn()
    counts: dict[str, int] = {}
    for event in prof.key_averages():
        name = event.key
        if name.startswith("aten::_scaled_dot_product") or "fmha" in name or "flash" in name.lower():
            counts[name] = counts.get(name, 0) + int(event.count)
    return counts


def scoring(model, vocab: int, lengths: list[int], exits: int, device: torch.device, autocast: bool) -> list:
    """Section 1: single-pass scoring against one forward pass, per trace length."""
    from rredcot.method.exit_scoring import ExitStrings
    from rredcot.method.forward import decoder_states
    from rredcot.method.prefix_scoring import ScoringBudget, score_traces_single_pass

    strings = ExitStrings([10, 11, 12], [13, 14], [15])
    budget = ScoringBudget()
    rows = []
    for length in lengths:
        trace = _trace(vocab, length, exits, length)
        ids = torch.tensor([[*trace.prompt_ids, *trace.completion_ids]], device=device)
        ctx = torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast)

        def forward(ids=ids, ctx=ctx) -> None:
            with torch.inference_mode(), ctx:
                decoder_states(model, ids)

        def single(trace=trace, ctx=ctx) -> None:
            with torch.inference_mode(), ctx:
                score_traces_single_pass(model, [trace], strings, budget)

        def measure(length=length, forward=forward, single=single, trace=trace) -> dict[str, Any]:
            forward()  # warm-up (kernels, allocator)
            with Meter(device) as f:
                forward()
            with Meter(device) as s:
                single()
            return {
                "tokens": length,
                "exits": len(trace.cuts),
                "forward_s": round(f.seconds, 3),
                "forward_peak_gb": round(f.peak_gb, 2),
                "single_pass_s": round(s.seconds, 3),
                "single_pass_peak_gb": round(s.peak_gb, 2),
                "ratio_to_forward": round(s.seconds / max(f.seconds, 1e-9), 2),
                "sdpa": _sdpa_kernels(single),
            }

        rows.append(_guarded(measure))
    return rows


def sigma_agreement(model, vocab: int, length: int, exits: int, device: torch.device) -> dict[str, Any]:
    """Section 2: σ·|o| in bf16 autocast against float32, same model and traces."""
    from rredcot.method import credit as C
    from rredcot.method import segmentation as S
    from rredcot.method.exit_scoring import ExitStrings
    from rredcot.method.prefix_scoring import score_traces_single_pass

    strings = ExitStrings([10, 11, 12], [13, 14], [15])
    traces = [_trace(vocab, length, exits, seed) for seed in range(4)]

    def sigmas(autocast: bool) -> list[torch.Tensor]:
        with torch.inference_mode(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            scores = score_traces_single_pass(model, traces, strings)
        out = []
        for t, sc in zip(traces, scores, strict=True):
            rewards = C.segment_rewards(C.exit_log_values(sc.log_p_solution, sc.log_p_answer))
            ids = S.segment_ids_from_starts(list(sc.cuts[:-1]), len(t.completion_ids))
            out.append(C.credit_multiplier("rredcot", len(t.completion_ids), -1.0, 0.5, ids, rewards))
        return out

    full, half = sigmas(False), sigmas(True)
    diff = max(float((a - b).abs().max()) for a, b in zip(full, half, strict=True))
    rel = max(float(((a - b).abs() / a.clamp_min(1e-6)).max()) for a, b in zip(full, half, strict=True))
    return {"traces": len(traces), "tokens": length, "max_abs_diff_sigma_x_len": diff, "max_rel_diff": rel}


def trainer_steps(shape: dict[str, Any], vocab: int, device: torch.device, completion: int) -> dict[str, Any]:
    """Section 3: three RREDCoTTrainer steps (bf16 autocast on CUDA) with a dense reward."""
    import tempfile

    from datasets import Dataset
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, TrainerCallback
    from trl import GRPOConfig

    from rredcot.adapter.trainer import RREDCoTTrainer
    from rredcot.method.assign import CreditConfig

    words = {f"w{i}": i for i in range(vocab - 2)} | {"<pad>": vocab - 2, "<eos>": vocab - 1}
    raw = Tokenizer(models.WordLevel(words, unk_token="<pad>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="<pad>", eos_token="<eos>")
    model = build(shape, vocab, completion + 256, torch.device("cpu"), torch.float32)
    prompts = Dataset.from_list(
        [
            {
                "prompt": " ".join(f"w{(7 * i + j) % 500}" for j in range(32)),
                "answer": "w9",
                "reference": "w8 w7",
            }
            for i in range(64)
        ]
    )
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


def micro_batch(shape: dict[str, Any], vocab: int, lengths: list[int], device: torch.device) -> list:
    """Section 4: forward + backward of the policy log-probabilities of one completion (TRL's fused
    LM head, gradient checkpointing, bf16 autocast on CUDA)."""
    from trl.trainer.utils import add_fused_lm_head

    cuda = device.type == "cuda"
    model = build(shape, vocab, max(lengths) + 512, device, torch.float32)
    model.gradient_checkpointing_enable()
    model.config.use_cache = False
    model.train()
    add_fused_lm_head(model, cast_lm_head_to_fp32=cuda)
    rows = []
    for length in lengths:

        def measure(length=length) -> dict[str, Any]:
            ids = torch.randint(10, vocab, (1, 256 + length), device=device)
            labels = ids.clone()
            labels[:, :256] = -100  # only completion tokens are scored
            with Meter(device) as m:
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                    out = model(input_ids=ids, labels=labels, fused_lm_head=True)
                out.log_probs.float().sum().backward()
            model.zero_grad(set_to_none=True)
            return {"tokens": length, "peak_gb": round(m.peak_gb, 2), "seconds": round(m.seconds, 2)}

        rows.append(_guarded(measure))
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="JSON report")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument(
        "--tiny", action="store_true", help="a tiny model and short traces (checks the code paths)"
    )
    ap.add_argument("--models", default=",".join(SHAPES))
    ap.add_argument("--lengths", default="8192,16384,25000")
    ap.add_argument("--exits", type=int, default=48)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            "rredcot gpu-check: no CUDA device here (use --device cpu --tiny to check the code paths)"
        )
    shapes = {"tiny": TINY} if args.tiny else {m: SHAPES[m] for m in args.models.split(",")}
    vocab = 512 if args.tiny else VOCAB
    lengths = [256, 512] if args.tiny else [int(x) for x in args.lengths.split(",")]
    exits = 8 if args.tiny else args.exits
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "models": {},
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

    smallest = next(iter(shapes.values()))
    _log.info("RREDCoTTrainer steps")
    report["trainer_steps"] = _guarded(
        lambda: trainer_steps(smallest, vocab if args.tiny else 32768, device, 64 if args.tiny else 512)
    )
    save()
    for name, shape in shapes.items():
        _log.info(f"{name}: scoring")
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        model = build(shape, vocab, max(lengths), device, dtype)
        entry = {"parameters_b": round(sum(p.numel() for p in model.parameters()) / 1e9, 3)}
        report["models"][name] = entry
        entry["scoring"] = scoring(model, vocab, lengths, exits, device, autocast=False)
        save()
        del model
        model = build(shape, vocab, max(lengths), device, torch.float32)
        _log.info(f"{name}: bf16 vs fp32 sigma")
        entry["sigma_bf16_vs_fp32"] = _guarded(
            lambda model=model: sigma_agreement(model, vocab, min(lengths), exits, device)
        )
        save()
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
        _log.info(f"{name}: TRL micro-batch")
        entry["micro_batch"] = micro_batch(shape, vocab, lengths, device)
        save()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print(save())


if __name__ == "__main__":
    setup_logging()
    main()
