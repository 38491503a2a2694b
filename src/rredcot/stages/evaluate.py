"""The evaluate stage: one model on every benchmark file, records and a per-benchmark summary.

Several data files can be evaluated in one call, each usually one benchmark; ``eval.max_problems``
caps each file. Generation runs on transformers or vLLM (``eval.backend``); the protocol is
:mod:`rredcot.lm.evaluation`'s.

CLI: ``rredcot evaluate --config C --model DIR --data test.jsonl [more.jsonl ...] --out records.jsonl
--summary summary.json --arm NAME --seed N``.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict

from rredcot.infra.io import write_json, write_jsonl
from rredcot.infra.logs import setup_logging
from rredcot.lm.evaluation import evaluate_with, load_benchmarks
from rredcot.lm.generation import VLLMOptions, make_generator
from rredcot.lm.modeling import load_tokenizer, set_threads
from rredcot.settings.reads import stage_config

_log = logging.getLogger(__name__)


def main(argv: Sequence[str] | None = None) -> None:
    from rredcot.infra.tracking import stage_run

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", nargs="+", required=True, help="config YAML file(s), later ones override")
    ap.add_argument("--model", required=True, help="model directory (save_pretrained layout)")
    ap.add_argument("--data", nargs="+", required=True, help="JSONL file(s) in the common schema")
    ap.add_argument("--out", required=True, help="per-problem records (JSONL)")
    ap.add_argument("--summary", required=True, help="per-benchmark summary (JSON)")
    ap.add_argument("--arm", required=True, help="arm name (or 'base' for the SFT model)")
    ap.add_argument("--seed", type=int, required=True, help="sampling seed")
    args = ap.parse_args(argv)

    cfg = stage_config(args.config, "evaluate")
    eval_cfg = cfg["eval"]
    set_threads(cfg["threads"]["eval"])
    rows = load_benchmarks(args.data, eval_cfg["max_problems"])
    options = VLLMOptions.from_config(eval_cfg["vllm"], cfg["vllm_cpu"], cfg["model"]["dtype"])
    params = {"eval": eval_cfg, "model": args.model, "n_problems": len(rows)}
    if eval_cfg["backend"] == "vllm":
        params["engine"] = asdict(options)  # what the engine ran with (a null dtype resolved)
    with stage_run(
        cfg,
        f"eval-{args.arm}-s{args.seed}",
        rule="evaluate",
        arm=args.arm,
        seed=args.seed,
        params=params,
    ) as run:
        t0 = time.time()
        tok = load_tokenizer(args.model)
        generator = make_generator(
            eval_cfg["backend"],
            args.model,
            tok,
            dtype=cfg["model"]["dtype"],
            batch_size=eval_cfg["batch_size"],
            options=options,
        )
        records, summary = evaluate_with(generator, tok, rows, cfg["prompt"], eval_cfg, args.seed)
        write_jsonl(args.out, records)
        write_json(args.summary, {"arm": args.arm, "seed": args.seed, "benchmarks": summary})
        for bench, stats in summary.items():
            run.log_metrics({f"{bench}/{key}": value for key, value in stats.items()})
        run.log_metrics({"eval_seconds": time.time() - t0})
        run.log_artifact(args.summary)
        run.log_artifact(args.out)
        k = eval_cfg["n_samples"]
        for bench, stats in summary.items():
            greedy = f"greedy {stats['greedy']:.3f} " if "greedy" in stats else ""
            _log.info(
                f"{args.arm} seed {args.seed}: {bench} {greedy}avg@{k} {stats[f'avg@{k}']:.3f} "
                f"pass@{k} {stats[f'pass@{k}']:.3f} ({stats['n']} problems)"
            )
        _log.info(f"{len(rows)} problems in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    setup_logging()
    main()
