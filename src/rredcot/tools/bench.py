"""Benchmark of credit-assignment cost: how close single-pass σ comes to the compute floor.

On one batch of traces it times

- ``forward``: one plain forward pass over ``prompt ⊕ completion`` (the unit of cost);
- ``sigma_single_pass``: σ as training computes it, by :class:`rredcot.method.assign.CreditAssigner`
  with the RREDCoT credit settings of ``--config`` and single-pass scoring (trace pass with entropies,
  segmentation, suffix pass, values, the answer baseline, σ); each pass is also timed on its own;
- ``sigma_naive``: the same σ with one sequence per exit point (``credit.scorer: naive``);
- ``mc_values``: Monte Carlo values at the same exit points, M sampled rollouts per exit point
  (``credit.mc.samples`` of the Monte Carlo arm), each continuing for the rest of the trace plus the
  answer (measured on a subset of traces, per trace);

and reports each as a ratio to ``forward`` next to the token-count bound ``(L + K·A)/L`` (L tokens per
trace, K exit points, A tokens per exit suffix). With ``--train-metrics`` it also summarises the
training-step time per arm from a workflow run (TRL's ``step_time`` in each ``metrics.jsonl``).

Every credit setting is the config's, so the σ timed is the σ training computes on these traces; only
the number of exit points is the batch's: ``--exits`` sets the segmentation's target (``n_segments``
= exits - 1, per trace, in place of ``tokens_per_segment``). The traces are word-level texts of a
tokenizer of the model's vocabulary (:func:`rredcot.tools.credit_batches.word_tokenizer`): a prompt,
thinking lines with a newline about every quarter of a segment, the exit string, a final solution
and its boxed answer, half of them with a positive advantage and half with a negative one.

CLI: ``rredcot bench --out results/bench/credit.json`` (see ``--help``). The model is randomly
initialised unless ``--model`` names a checkpoint: timing does not depend on the weights, and MC
rollouts are forced to their full length so that the cost is the same for any model.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from rredcot.infra.io import write_json
from rredcot.infra.logs import setup_logging
from rredcot.lm.modeling import load_model, qwen2_shape, random_model, set_threads
from rredcot.method.assign import CreditAssigner, TraceCredit
from rredcot.method.registry import TraceInput
from rredcot.method.settings import CreditConfig
from rredcot.settings.config import credit_config, load_config
from rredcot.tools.credit_batches import (
    batch_credit,
    credit_agreement,
    suffix_tokens,
    synthetic_traces,
    word_tokenizer,
)

_log = logging.getLogger(__name__)


def _timed(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """Median wall time of ``repeats`` calls (after one warm-up call) and the last result."""
    fn()
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def make_model(args: argparse.Namespace) -> torch.nn.Module:
    if args.model:
        return load_model(args.model, "float32").eval()  # float32, as the random model
    max_positions = 4 * (args.prompt + args.length + args.suffix)
    return random_model(qwen2_shape(args.hidden, args.layers, args.heads), args.vocab, max_positions)


@dataclass
class Batch:
    """The benchmark's batch: a model, a tokenizer of its vocabulary, traces, and the credit settings
    σ is computed with."""

    model: torch.nn.Module
    tok: Any
    items: list[TraceInput]
    credit: CreditConfig


def make_batch(args: argparse.Namespace, cfg: Mapping[str, Any]) -> Batch:
    """The model and ``args.traces`` random traces of ``args.prompt`` + ``args.length`` tokens (see the
    module docstring), with the config's RREDCoT credit at ``args.exits`` exit points per trace."""
    model = make_model(args)
    tok = word_tokenizer(model.get_output_embeddings().weight.shape[0])
    # The reference solution and the trace's own final solution: the suffix less the texts around them.
    solution = max(1, args.suffix - 8)
    items = synthetic_traces(
        tok, args.traces, (args.length, args.length), args.exits, solution, solution, args.prompt, args.seed
    )
    return Batch(model, tok, items, batch_credit(cfg, args.exits))


def sigma(batch: Batch, scorer: str) -> tuple[list[TraceCredit], dict[str, float]]:
    """σ of every trace of the batch as training computes it, its exit points scored by ``scorer``
    (single_pass or naive), and the seconds of each pass."""
    assigner = CreditAssigner(batch.tok, replace(batch.credit, scorer=scorer))
    with torch.inference_mode():
        credits = assigner.assign(batch.model, batch.items)
    return credits, dict(assigner.seconds)


def mc_samples(cfg: Mapping[str, Any]) -> int:
    """M of the Monte Carlo arm (the first arm with credit mc, else the credit section's)."""
    arm = next((a for a, spec in cfg["arms"].items() if spec["credit"] == "mc"), next(iter(cfg["arms"])))
    return credit_config(cfg, arm, "mc").mc.samples


def forward_pass(model: torch.nn.Module, traces: Sequence[TraceInput]) -> torch.Tensor:
    """One plain batched forward over prompt ⊕ completion, logits included (the unit of cost)."""
    seqs = [[*t.prompt_ids, *t.completion_ids] for t in traces]
    ids = torch.zeros(len(seqs), max(len(s) for s in seqs), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, seq in enumerate(seqs):
        ids[b, : len(seq)], mask[b, : len(seq)] = torch.tensor(seq), 1
    with torch.inference_mode():
        return model(input_ids=ids, attention_mask=mask, use_cache=False).logits


def mc_values(
    model: torch.nn.Module, trace: TraceInput, cuts: list[int], samples: int, answer_tokens: int
) -> list[float]:
    """Generation cost of MC values: ``samples`` rollouts per cut, to the trace's end plus an answer."""
    out = []
    with torch.inference_mode():
        for c in cuts:
            prefix = torch.tensor([[*trace.prompt_ids, *trace.completion_ids[:c]]] * samples)
            new = len(trace.completion_ids) - c + answer_tokens
            gen = model.generate(
                input_ids=prefix,
                attention_mask=torch.ones_like(prefix),
                do_sample=True,
                max_new_tokens=new,
                min_new_tokens=new,
                pad_token_id=0,
            )
            out.append(float(gen.shape[1]))
    return out


def train_step_summary(root: Path) -> dict[str, Any]:
    """Median training-step seconds per arm over every seed's metrics.jsonl under ``root``."""
    per_arm: dict[str, list[float]] = {}
    for path in sorted(root.glob("*/seed*/metrics.jsonl")):
        arm = path.parent.parent.name
        for line in path.read_text().splitlines():
            row = json.loads(line)
            # TRL's own step timer (generation, credit, loss, update; probes excluded).
            seconds = row.get("step_time", row.get("perf/step_seconds"))
            if seconds is not None:
                per_arm.setdefault(arm, []).append(float(seconds))
    summary: dict[str, Any] = {
        arm: {"median_step_seconds": statistics.median(v), "steps": len(v)} for arm, v in per_arm.items() if v
    }
    base = summary.get("grpo", {}).get("median_step_seconds")
    if base:
        for arm in summary:
            summary[arm]["ratio_to_grpo"] = summary[arm]["median_step_seconds"] / base
    return summary


def train_step_ab(config: list[str], sft: str, data: str, arms: list[str], steps: int) -> dict[str, Any]:
    """Median training-step time of each arm, run one after the other from the same SFT model and seed.

    A controlled A/B: same process, same threads, no other job competing, and (the seed being equal)
    the same prompts; the first step even samples the same completions in every arm. The arms' batches
    drift apart after the first update, so each arm also gets a paired estimate from its own steps:
    ``within_run_ratio`` is the median of step / (step - credit seconds), the step against the same
    step with the credit computation taken out (everything else in a step is stock GRPO).
    """
    from datasets import Dataset

    from rredcot.adapter.experiment import grpo_args
    from rredcot.adapter.trainer import RREDCoTTrainer
    from rredcot.data.records import correctness_reward, rl_records
    from rredcot.infra.io import read_jsonl
    from rredcot.lm.modeling import load_tokenizer
    from rredcot.lm.vllm_engine import prepare_engine

    cfg = load_config(config, {"rl": {"max_steps": steps, "save_every": 0}, "credit": {"view_every": 0}})
    set_threads(cfg["threads"]["train"])  # as in the workflow
    gpu = cfg["rl"]["gpu"]
    if gpu["use_vllm"] and gpu["vllm_mode"] == "colocate":  # as the train stage, one engine at a time
        prepare_engine(cfg["vllm_cpu"]["kv_cache_gib"], sft, "rredcot bench --train-steps")
    tok = load_tokenizer(sft)
    dataset = Dataset.from_list(rl_records(read_jsonl(data), cfg["prompt"]["template"]))
    out: dict[str, Any] = {}
    for arm in arms:
        torch.manual_seed(0)
        trainer = RREDCoTTrainer(
            model=load_model(sft, "float32"),  # float32 master weights, as the train stage
            reward_funcs=[correctness_reward],
            args=grpo_args(cfg, arm, 0, f"/tmp/rredcot-bench-{arm}"),
            train_dataset=dataset,
            processing_class=tok,
            credit=credit_config(cfg, arm),
        )
        trainer.args.disable_tqdm = True
        trainer.train()
        logged = [h for h in trainer.state.log_history if "step_time" in h]
        times = [h["step_time"] for h in logged]
        credit = [h["credit/seconds"] for h in logged if "credit/seconds" in h]
        paired = [h["step_time"] / (h["step_time"] - h.get("credit/seconds", 0.0)) for h in logged[1:]]
        out[arm] = {
            "median_step_seconds": statistics.median(times[1:] or times),  # the first step warms up
            "steps": len(times),
            "median_credit_seconds": statistics.median(credit) if credit else 0.0,
            "within_run_ratio": statistics.median(paired) if paired else 1.0,
        }
        _log.info(f"train step {arm}: {out[arm]}")
    base = out[arms[0]]["median_step_seconds"]
    for arm in arms:
        out[arm]["ratio_to_" + arms[0]] = out[arm]["median_step_seconds"] / base
    return out


def precision(config: list[str], model_dir: str, data: str, n_traces: int, seed: int) -> dict[str, Any]:
    """σ of the same traces under bf16 autocast against float32, on a trained model.

    Traces are sampled from the model (``rl.temperature``, ``rl.max_completion_length``) on the first
    ``n_traces`` problems of ``data`` (advantage +1 when correct, -1 when wrong); σ comes from
    ``CreditAssigner`` with the config's RREDCoT settings,
    once in float32 and once under bf16 autocast (decoder in bf16; the LM head's product from bf16
    operands with a float32 result, as on a GPU). Reported: max |Δ σ·|o||, and the share of traces
    whose most-credited segment (most-blamed for a wrong trace) is the same token span."""
    from rredcot.data.grading import grade
    from rredcot.data.records import format_prompt, reference_solution
    from rredcot.infra.io import read_jsonl
    from rredcot.lm.generation import HFGenerator
    from rredcot.lm.modeling import load_tokenizer
    from rredcot.settings.config import rredcot_credit

    cfg = load_config(config)
    tok = load_tokenizer(model_dir)
    model = load_model(model_dir, "float32").eval()  # the master weights; bf16 comes from autocast
    rows = read_jsonl(data)[:n_traces]
    prompts = [format_prompt(cfg["prompt"]["template"], r["problem"]) for r in rows]
    sampler = HFGenerator(model, tok, batch_size=cfg["eval"]["batch_size"])
    sampled = sampler.generate(
        prompts,
        temperature=cfg["rl"]["temperature"],
        top_p=1.0,  # training samples from the whole distribution (TRL's top_k=0, no nucleus)
        max_new_tokens=cfg["rl"]["max_completion_length"],
        seed=seed,
    )
    assigner = CreditAssigner(tok, rredcot_credit(cfg))
    items = [
        TraceInput(
            assigner.encode(p),
            list(c[0].token_ids),
            1.0 if grade(c[0].text, str(r["answer"])) else -1.0,
            [(reference_solution(r.get("solution")) or "", str(r["answer"]))],
        )
        for p, c, r in zip(prompts, sampled, rows, strict=True)
        if c[0].token_ids
    ]
    with torch.inference_mode():
        full = assigner.assign(model, items)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            half = assigner.assign(model, items)
    return {
        "model": model_dir,
        "traces": len(items),
        "wrong_traces": sum(t.advantage < 0 for t in items),
        **credit_agreement(full, half, items),
    }


def scoring_report(args: argparse.Namespace) -> dict[str, Any]:
    """Forward, single-pass σ, naive σ and Monte Carlo values on one batch of random traces."""
    set_threads(args.threads)
    cfg = load_config(args.config)
    batch = make_batch(args, cfg)
    model, traces = batch.model, batch.items
    vocab = model.get_output_embeddings().weight.shape[0]
    _log.info(
        f"{len(traces)} traces x {args.prompt}+{args.length} tokens, {args.exits} exit points, "
        f"credit of {', '.join(args.config)}"
    )

    t_forward, _ = _timed(lambda: forward_pass(model, traces), args.repeats)
    _log.info(f"forward {t_forward:.3f} s")
    t_single, (single, passes_single) = _timed(lambda: sigma(batch, "single_pass"), args.repeats)
    _log.info(f"sigma single-pass {t_single:.3f} s ({passes_single})")
    t_naive, (naive, passes_naive) = _timed(lambda: sigma(batch, "naive"), max(1, args.repeats // 2))
    _log.info(f"sigma naive {t_naive:.3f} s")

    diff = max(
        float((x - y).abs().max())
        for a, b in zip(single, naive, strict=True)
        for x, y in ((a.log_p_solution, b.log_p_solution), (a.log_p_answer, b.log_p_answer))
    )
    sigma_diff = max(
        float((a.multiplier - b.multiplier).abs().max()) for a, b in zip(single, naive, strict=True)
    )
    _log.info(f"max |log p single - naive| = {diff:.2e}, max |σ·|o|| difference {sigma_diff:.2e}")

    assigner = CreditAssigner(batch.tok, batch.credit)
    trace_tokens, suffix = suffix_tokens(assigner, traces, single)
    n_cuts = sum(len(c.cuts) for c in single)
    n_exits = n_cuts / len(single)
    a_tokens = suffix / max(n_cuts, 1)
    bound = (trace_tokens + suffix) / trace_tokens
    scoring = passes_single.get("scoring", 0.0)

    m = mc_samples(cfg)
    mc_traces = traces[: args.mc_traces]
    t0 = time.perf_counter()
    for t, c in zip(mc_traces, single, strict=False):
        mc_values(model, t, list(c.cuts), m, answer_tokens=round(a_tokens))
    t_mc = None  # not measured (--mc-traces 0)
    if mc_traces:
        t_mc = (time.perf_counter() - t0) * len(traces) / len(mc_traces)  # scaled to the whole batch
        _log.info(f"MC values (M={m}) {t_mc:.1f} s for the batch (scaled)")

    report: dict[str, Any] = {
        "setup": {
            "traces": len(traces),
            "prompt_tokens": args.prompt,
            "completion_tokens": args.length,
            "trace_tokens_L": trace_tokens / len(traces),
            "exit_points_K": n_exits,
            "suffix_tokens_A": a_tokens,
            "mc_samples_M": m,
            "mc_traces_measured": len(mc_traces),
            "config": args.config,
            "credit": {k: str(v) for k, v in vars(batch.credit).items() if k != "mc"},
            "model": args.model
            or f"random Qwen2 h{args.hidden} x{args.layers} heads {args.heads} vocab {vocab}",
            "parameters": sum(p.numel() for p in model.parameters()),
            "threads": torch.get_num_threads(),
            "device": "cpu",
            "machine": platform.platform(),
            "torch": torch.__version__,
        },
        "seconds": {
            "forward": t_forward,
            "sigma_single_pass": t_single,
            "sigma_naive": t_naive,
            "mc_values": t_mc,
        },
        # CreditAssigner's passes of the last timed call (scoring: trace and suffix pass, segmentation).
        "passes_single_pass": passes_single,
        "passes_naive": passes_naive,
        "ratios": {
            "token_bound_(L+KA)/L": bound,
            "single_pass_over_forward": t_single / t_forward,
            "scoring_over_forward": scoring / t_forward,
            "scoring_over_bound": scoring / t_forward / bound,
            "naive_over_forward": t_naive / t_forward,
            "naive_over_single_pass": t_naive / t_single,
            # The scorers alone: σ's other passes (the greedy answer baseline) are the same for both.
            "naive_scoring_over_single_pass_scoring": passes_naive.get("scoring", 0.0) / max(scoring, 1e-9),
            **({"mc_over_forward": t_mc / t_forward, "mc_over_single_pass": t_mc / t_single} if t_mc else {}),
        },
        "max_abs_logprob_diff_single_vs_naive": diff,
        "max_abs_multiplier_diff_single_vs_naive": sigma_diff,
    }
    return report


def run(args: argparse.Namespace) -> dict[str, Any]:
    report = scoring_report(args) if args.traces > 0 else {}
    if args.train_metrics and Path(args.train_metrics).is_dir():
        report["train_step_workflow"] = train_step_summary(Path(args.train_metrics))
    if args.precision_traces > 0:
        set_threads(load_config(args.config)["threads"]["train"])  # as in the workflow
        report["precision_bf16"] = precision(
            args.config, args.precision_model, args.precision_data, args.precision_traces, args.seed
        )
        _log.info(f"bf16 against float32 sigma: {report['precision_bf16']}")
    if args.train_steps > 0:
        if not Path(args.sft).is_dir():
            raise SystemExit(f"--train-steps needs the SFT model at {args.sft} (run the workflow first)")
        report["train_step_ab"] = train_step_ab(
            args.config, args.sft, args.rl_data, args.arms, args.train_steps
        )
    return report


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="results/bench/credit.json", help="JSON report path")
    ap.add_argument(
        "--config",
        nargs="+",
        default=["config/config.yaml"],
        help="config YAML file(s): the credit settings of σ, M, and the settings of --train-steps",
    )
    ap.add_argument("--model", help="checkpoint directory (default: a randomly initialised Qwen2)")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--traces", type=int, default=8, help="traces in the batch (0: no scoring benchmark)")
    ap.add_argument("--prompt", type=int, default=64, help="prompt tokens per trace")
    ap.add_argument("--length", type=int, default=1024, help="completion tokens per trace")
    ap.add_argument(
        "--exits", type=int, default=32, help="exit points per trace (segments + 1): segmentation target"
    )
    ap.add_argument("--suffix", type=int, default=48, help="reference solution + answer tokens (about)")
    ap.add_argument("--mc-traces", type=int, default=1, help="traces whose MC cost is measured")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=max(1, torch.get_num_threads()))
    ap.add_argument("--seed", type=int, default=0, help="seed of the random batch and of --precision-traces")
    ap.add_argument("--train-metrics", default="results/train", help="workflow train folder to summarise")
    ap.add_argument("--train-steps", type=int, default=0, help="also time N training steps per arm (A/B)")
    ap.add_argument("--sft", default="results/models/sft", help="SFT model for --train-steps")
    ap.add_argument("--rl-data", default="results/data/rl.clean.jsonl", help="RL split for --train-steps")
    ap.add_argument("--arms", nargs="+", default=["grpo", "rredcot", "entropy", "rredcot_entropy"])
    ap.add_argument(
        "--precision-traces", type=int, default=0, help="also compare bf16 and float32 σ on N sampled traces"
    )
    ap.add_argument("--precision-model", default="results/models/sft", help="model of --precision-traces")
    ap.add_argument("--precision-data", default="results/data/test.jsonl", help="problems to sample from")
    return ap


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    report = run(args)
    write_json(Path(args.out), report)
    if "ratios" in report:
        print(json.dumps(report["ratios"], indent=2))
    for key in ("train_step_workflow", "train_step_ab", "precision_bf16"):
        if key in report:
            print(key, json.dumps(report[key], indent=2))
    _log.info(f"wrote {args.out}")


if __name__ == "__main__":
    setup_logging()
    main()
