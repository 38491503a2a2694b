"""Peak memory of each credit pass on long traces, against what its ``ScoringBudget`` allows.

Each pass runs in a fresh process on a randomly initialised Qwen2 model with a real-size vocabulary
(32,768 by default) and traces of 4k-16k tokens with 48 exit points, whose final answers are not the
ones the model would write (a random model never writes them), so the greedy answer baseline decodes:

- ``single_pass``: trace pass (KV cache, entropies) and suffix pass (packed exit suffixes);
- ``greedy_baseline``: prefill of every unfaithful trace and greedy decoding of its final solution;
- ``entropies``: the policy's token entropies (the entropy credit arms, segmentation by a frozen model);
- ``naive``: the one-sequence-per-exit reference scorer.

The peak is the largest resident set size seen during the pass (sampled every 2 ms) minus the size
before it. The budget is the config's ``credit.budget`` (``--config``; ``--max-batch-tokens``
overrides its token bound). The bound is what the budget admits for one pass: ``max_batch_tokens``
tokens of KV cache and one layer's activations, ``max_logit_elements`` float32 logits three times
over (logits, log-softmax, probabilities) and ``max_mask_elements`` mask entries (bool and float).

    rredcot bench-memory --out results/bench/memory.json          # or: python -m rredcot.tools.bench_memory

The file also runs as a script against another checkout of the package (``PYTHONPATH=OTHER/src
python src/rredcot/bench_memory.py``); it adapts to the older signatures, so that the same passes
can be measured before and after a change.
"""

from __future__ import annotations

import argparse
import inspect
import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rredcot.infra.logs import setup_logging
from rredcot.infra.memory import PeakRSS
from rredcot.lm.modeling import qwen2_shape, random_model

PASSES = ("single_pass", "greedy_baseline", "entropies", "naive")


def _model(args: argparse.Namespace) -> Any:
    return random_model(qwen2_shape(args.hidden, args.layers, args.heads), args.vocab, args.max_length + 1024)


def _budget(args: argparse.Namespace) -> Any:
    """The credit passes' budget: the config's ``credit.budget``, with ``--max-batch-tokens`` when given."""
    from rredcot.method.scoring.types import ScoringBudget
    from rredcot.settings.config import load_config

    budget = dict(load_config(args.config)["credit"]["budget"])
    if args.max_batch_tokens is not None:
        budget["max_batch_tokens"] = args.max_batch_tokens
    return ScoringBudget(**budget)


def budget_bound(args: argparse.Namespace, budget: Any) -> int:
    """Bytes one pass may hold under ``budget`` (float32 model), as the module docstring says."""
    head_dim = args.hidden // args.heads
    kv = args.layers * 2 * max(1, args.heads // 2) * head_dim * 4
    activations = (4 * args.hidden + 3 * 3 * args.hidden) * 4
    from rredcot.method.forward import CPU_LOGIT_ELEMENTS

    # null: the passes follow free memory on a GPU and take CPU_LOGIT_ELEMENTS at a time on a CPU.
    logits = (budget.max_logit_elements or CPU_LOGIT_ELEMENTS) * 4 * 3
    mask = budget.max_mask_elements * (1 + 4)
    return budget.max_batch_tokens * (kv + activations) + logits + mask


def _traces(args: argparse.Namespace, length: int, count: int) -> list[Any]:
    from rredcot.method.scoring.types import TraceExits

    rng = random.Random(length)
    out = []
    for _ in range(count):
        prompt = [rng.randrange(2, args.vocab) for _ in range(64)]
        completion = [rng.randrange(2, args.vocab) for _ in range(length)]
        step = max(1, length // args.exits)
        cuts = list(range(0, length, step))[: args.exits] + [length - 40]
        pairs = [
            (
                [rng.randrange(2, args.vocab) for _ in range(64)],
                [rng.randrange(2, args.vocab) for _ in range(2)],
            )
        ]
        out.append(TraceExits(prompt, completion, sorted(set(cuts)), pairs, length - 8))
    return out


def _call(fn: Any, *a: Any, budget: Any, **kw: Any) -> Any:
    """Call with the budget where the signature takes one (else its ``max_batch_tokens`` as before)."""
    params = inspect.signature(fn).parameters
    if "budget" in params:
        return fn(*a, budget=budget, **kw)
    if "max_batch_tokens" in params:
        return fn(*a, max_batch_tokens=budget.max_batch_tokens, **kw)
    return fn(*a, **kw)


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One pass at one length in this process: peak bytes above the start, seconds."""
    import torch

    torch.set_num_threads(args.threads)
    model, budget = _model(args), _budget(args)
    from rredcot.method.scoring.types import ExitStrings

    strings = ExitStrings([3, 4, 5], [6, 7], [8])
    lengths = [int(x) for x in args.lengths.split(",")]
    if args.child == "greedy_baseline":
        from rredcot.method.answer_baseline import greedy_answer_log_probs

        traces = [t for n in lengths for t in _traces(args, n, 1)]
        heads = [[*t.prompt_ids, *t.completion_ids[: t.answer_cut - 32]] for t in traces]
        start = [len(h) for h in heads]

        def work() -> Any:
            return _call(
                greedy_answer_log_probs,
                model,
                heads,
                [t.pairs[0][1] for t in traces],
                [6, 7],
                [8],
                lambda solution: None,  # a random model never writes the answer prefix: decode to the limit
                [1],
                72,
                solution_starts=start,
                budget=budget,
            )
    else:
        traces = [t for n in lengths for t in _traces(args, n, 1)]
        if args.child == "single_pass":
            from rredcot.method.scoring.single_pass import score_traces_single_pass

            def work() -> Any:
                return score_traces_single_pass(model, traces, strings, budget)
        elif args.child == "entropies":
            from rredcot.method.scoring.entropies import completion_entropies

            def work() -> Any:
                return _call(
                    completion_entropies,
                    model,
                    [(t.prompt_ids, t.completion_ids) for t in traces],
                    budget=budget,
                )
        else:
            from rredcot.method.scoring.naive import score_traces_naive

            def work() -> Any:
                return _call(score_traces_naive, model, traces, strings, budget=budget)

    t0 = time.perf_counter()
    with torch.inference_mode(), PeakRSS() as rss:
        work()
    return {
        "pass": args.child,
        "lengths": lengths,
        "peak_mb": round((rss.peak - rss.start) / 2**20, 1),
        "seconds": round(time.perf_counter() - t0, 2),
        "bound_mb": round(budget_bound(args, budget) / 2**20, 1),
    }


def _child_argv(args: argparse.Namespace, name: str, lengths: str) -> list[str]:
    keep = ["vocab", "hidden", "layers", "heads", "exits", "max_batch_tokens", "threads", "max_length"]
    flags = [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in keep if getattr(args, k) is not None]
    return [
        sys.executable,
        "-m",
        "rredcot.tools.bench_memory",
        f"--child={name}",
        f"--lengths={lengths}",
        "--config",
        *args.config,
        *flags,
    ]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="JSON results (default: print only)")
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--exits", type=int, default=48)
    ap.add_argument(
        "--config", nargs="+", default=["config/config.yaml"], help="config YAML file(s): the credit.budget"
    )
    ap.add_argument("--max-batch-tokens", type=int, help="tokens per pass (default: the config's)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lengths", default="4096,8192,16384", help="trace lengths (tokens), comma-separated")
    ap.add_argument("--naive-lengths", default="4096", help="lengths for the naive scorer (it is slow)")
    ap.add_argument("--max-length", type=int, default=16384)
    ap.add_argument("--passes", default=",".join(PASSES))
    ap.add_argument("--child", choices=PASSES, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args)), flush=True)
        return
    lengths = [int(x) for x in args.lengths.split(",")]
    args.max_length = max(lengths)
    results = []
    for name in args.passes.split(","):
        # The greedy baseline takes all traces in one call (its batching is what is measured); the
        # others one length per call, so each length's peak shows.
        groups = (
            [args.lengths]
            if name == "greedy_baseline"
            else (args.naive_lengths if name == "naive" else args.lengths).split(",")
        )
        for group in groups:
            proc = subprocess.run(_child_argv(args, name, group), capture_output=True, text=True)
            if proc.returncode != 0:
                row = {"pass": name, "lengths": group, "error": proc.stderr.strip().splitlines()[-1:]}
            else:
                row = json.loads(proc.stdout.strip().splitlines()[-1])
            results.append(row)
            print(json.dumps(row), flush=True)
    report = {
        "model": {k: getattr(args, k) for k in ("vocab", "hidden", "layers", "heads")},
        "exits": args.exits,
        "config": args.config,
        "max_batch_tokens": _budget(args).max_batch_tokens,
        "results": results,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    setup_logging()
    main()
