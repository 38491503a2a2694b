"""Held-out evaluation: generate, extract the boxed answer, grade with math-verify, aggregate.

Protocol (identical for every arm): greedy decoding once, plus ``k`` sampled completions per problem
at the configured temperature/top-p (avg@k = mean correctness over the samples). Results are kept
per problem and aggregated per benchmark (for the synthetic task: per difficulty level, and "all").

CLI: ``python -m rredcot.evaluate --config C --model DIR --data test.jsonl --out records.jsonl
--summary summary.json --arm NAME --seed N``.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from tqdm.auto import tqdm

from rredcot.config import load_config
from rredcot.data import format_prompt
from rredcot.grading import extract_boxed, grade
from rredcot.jsonl import read_jsonl, write_json, write_jsonl
from rredcot.modeling import load_model, load_tokenizer, set_threads


@torch.inference_mode()
def generate(
    model: torch.nn.Module,
    tokenizer: Any,
    prompts: Sequence[str],
    *,
    greedy: bool,
    n: int = 1,
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_new_tokens: int = 128,
    batch_size: int = 64,
    seed: int = 0,
    progress: bool = False,
) -> list[list[str]]:
    """``n`` completions per prompt (decoded, special tokens dropped), in prompt order."""
    was_training = model.training
    model.eval()
    tokenizer.padding_side = "left"
    flat = [p for p in prompts for _ in range(n)]
    texts: list[str] = []
    batches = range(0, len(flat), batch_size)
    # A private RNG stream: probes during training must not reset the trainer's sampling RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for start in tqdm(batches, desc="generate", disable=not progress, unit="batch"):
            texts.extend(
                _generate_batch(
                    model,
                    tokenizer,
                    flat[start : start + batch_size],
                    greedy,
                    temperature,
                    top_p,
                    max_new_tokens,
                )
            )
    model.train(was_training)
    return [texts[i * n : (i + 1) * n] for i in range(len(prompts))]


def _generate_batch(
    model: torch.nn.Module,
    tokenizer: Any,
    chunk: list[str],
    greedy: bool,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
) -> list[str]:
    enc = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
    out = model.generate(
        **enc,
        max_new_tokens=max_new_tokens,
        do_sample=not greedy,
        temperature=temperature if not greedy else None,
        top_p=top_p if not greedy else None,
        top_k=0 if not greedy else None,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)


def benchmark_of(row: Mapping[str, Any]) -> str:
    """Benchmark name of a row: its source plus difficulty level for synthetic data."""
    if row.get("source") == "synthetic":
        return f"level_{row['level']}"
    return str(row.get("source") or "all")


def probe_accuracy(
    model: torch.nn.Module,
    tokenizer: Any,
    rows: Sequence[Mapping[str, Any]],
    template: str,
    eval_cfg: Mapping[str, Any],
    seed: int = 0,
) -> dict[str, float]:
    """Greedy and sampled (avg@k) accuracy on ``rows``: the learning-curve probe during training."""
    _, summary = evaluate_rows(model, tokenizer, rows, template, eval_cfg, seed, progress=False)
    return {"greedy": summary["all"]["greedy"], "sampled": summary["all"][f"avg@{eval_cfg['n_samples']}"]}


def evaluate_rows(
    model: torch.nn.Module,
    tokenizer: Any,
    rows: Sequence[Mapping[str, Any]],
    template: str,
    eval_cfg: Mapping[str, Any],
    seed: int,
    progress: bool = True,
) -> tuple[list[dict[str, Any]], dict[str, dict[str, float]]]:
    """Per-problem records and per-benchmark summary (``greedy``, ``avg@k``, ``pass@k``, ``n``)."""
    prompts = [format_prompt(template, r["problem"]) for r in rows]
    common = {
        "max_new_tokens": eval_cfg["max_new_tokens"],
        "batch_size": eval_cfg["batch_size"],
        "progress": progress,
    }
    greedy_out = generate(model, tokenizer, prompts, greedy=True, **common)
    k = eval_cfg["n_samples"]
    sampled_out = generate(
        model,
        tokenizer,
        prompts,
        greedy=False,
        n=k,
        temperature=eval_cfg["temperature"],
        top_p=eval_cfg["top_p"],
        seed=seed,
        **common,
    )
    records = []
    for row, g, samples in zip(rows, greedy_out, sampled_out, strict=True):
        gold = str(row["answer"])
        correct = [grade(s, gold) for s in samples]
        records.append(
            {
                "id": row["id"],
                "benchmark": benchmark_of(row),
                "answer": gold,
                "greedy_completion": g[0],
                "greedy_pred": extract_boxed(g[0]),
                "greedy_correct": grade(g[0], gold),
                "sample_preds": [extract_boxed(s) for s in samples],
                "sample_correct": correct,
            }
        )
    return records, summarize(records, k)


def summarize(records: Sequence[Mapping[str, Any]], k: int) -> dict[str, dict[str, float]]:
    """Aggregate per benchmark and over everything."""
    groups: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for rec in records:
        groups[rec["benchmark"]].append(rec)
        groups["all"].append(rec)
    summary = {}
    for name, recs in sorted(groups.items()):
        n = len(recs)
        summary[name] = {
            "n": n,
            "greedy": sum(r["greedy_correct"] for r in recs) / n,
            f"avg@{k}": sum(sum(r["sample_correct"]) / len(r["sample_correct"]) for r in recs) / n,
            f"pass@{k}": sum(any(r["sample_correct"]) for r in recs) / n,
        }
    return summary


def main(argv: Sequence[str] | None = None) -> None:
    from rredcot.tracking import stage_run

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", nargs="+", required=True, help="config YAML file(s), later ones override")
    ap.add_argument("--model", required=True, help="model directory (save_pretrained layout)")
    ap.add_argument("--data", required=True, help="JSONL test split in the common schema")
    ap.add_argument("--out", required=True, help="per-problem records (JSONL)")
    ap.add_argument("--summary", required=True, help="per-benchmark summary (JSON)")
    ap.add_argument("--arm", required=True, help="arm name (or 'base' for the SFT model)")
    ap.add_argument("--seed", type=int, required=True, help="sampling seed")
    args = ap.parse_args(argv)

    cfg = load_config(args.config)
    set_threads(cfg["threads"]["eval"])
    rows = read_jsonl(args.data)
    if cfg["eval"].get("max_problems"):
        rows = rows[: cfg["eval"]["max_problems"]]
    with stage_run(
        cfg,
        f"eval-{args.arm}-s{args.seed}",
        rule="evaluate",
        arm=args.arm,
        seed=args.seed,
        params={"eval": cfg["eval"], "model": args.model, "n_problems": len(rows)},
    ) as run:
        t0 = time.time()
        model, tok = load_model(args.model), load_tokenizer(args.model)
        records, summary = evaluate_rows(model, tok, rows, cfg["prompt"]["template"], cfg["eval"], args.seed)
        write_jsonl(args.out, records)
        write_json(args.summary, {"arm": args.arm, "seed": args.seed, "benchmarks": summary})
        for bench, stats in summary.items():
            run.log_metrics({f"{bench}/{key}": value for key, value in stats.items()})
        run.log_metrics({"eval_seconds": time.time() - t0})
        run.log_artifact(args.summary)
        run.log_artifact(args.out)
        k = cfg["eval"]["n_samples"]
        print(
            f"[evaluate] {args.arm} seed {args.seed}: all greedy {summary['all']['greedy']:.3f} "
            f"avg@{k} {summary['all'][f'avg@{k}']:.3f} ({len(rows)} problems, {time.time() - t0:.0f}s)"
        )


if __name__ == "__main__":
    main()
