"""Evaluating a model on problems: generate, read the final boxed answer, grade, aggregate.

Protocol (identical for every arm): ``k`` sampled completions per problem at the configured
temperature/top-p (avg@k = mean correctness over the samples, pass@k = any sample correct), plus an
optional greedy completion (``eval.greedy``; real-benchmark protocols usually sample only). The
answer is the last ``\\boxed{}`` after the thinking block (``prompt.exit_string``), or in the whole
completion when the block is never closed. Results are kept per problem and aggregated per
benchmark (the row's ``source``; for the synthetic task its difficulty level) and over ``all``.
The evaluate stage and the training probe both use it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from rredcot.data.grading import answers_equivalent, extract_answer
from rredcot.data.records import build_prompts
from rredcot.infra.io import read_jsonl
from rredcot.lm.generation import Completion, Generator, HFGenerator


def benchmark_of(row: Mapping[str, Any]) -> str:
    """Benchmark name of a row: its source, plus the difficulty level for synthetic data."""
    if row.get("source") == "synthetic":
        return f"level_{row['level']}"
    # Never "all": that name is the aggregate over every benchmark.
    return str(row.get("source") or "unknown")


def evaluate_rows(
    model: torch.nn.Module,
    tokenizer: Any,
    rows: Sequence[Mapping[str, Any]],
    template: str | Mapping[str, Any],
    eval_cfg: Mapping[str, Any],
    seed: int,
    progress: bool = True,
    greedy: bool | None = None,
) -> tuple[list[dict[str, Any]], dict[str, dict[str, float]]]:
    """Evaluate a model in memory (transformers backend); see :func:`evaluate_with`.

    ``template`` is the config's ``prompt`` section, or just its template string (then the whole
    completion is searched for the answer).
    """
    generator = HFGenerator(model, tokenizer, batch_size=eval_cfg["batch_size"], progress=progress)
    return evaluate_with(generator, tokenizer, rows, template, eval_cfg, seed, greedy=greedy)


def evaluate_with(
    generator: Generator,
    tokenizer: Any,
    rows: Sequence[Mapping[str, Any]],
    prompt_cfg: str | Mapping[str, Any],
    eval_cfg: Mapping[str, Any],
    seed: int,
    greedy: bool | None = None,
) -> tuple[list[dict[str, Any]], dict[str, dict[str, float]]]:
    """Per-problem records and per-benchmark summary (``n``, ``greedy``, ``avg@k``, ``pass@k``, ...).

    ``greedy`` overrides ``eval.greedy``.
    """
    if greedy is None:
        greedy = eval_cfg["greedy"]
    prompts = build_prompts(prompt_cfg, [r["problem"] for r in rows], tokenizer)
    exit_string = None if isinstance(prompt_cfg, str) else prompt_cfg["exit_string"]
    budget = eval_cfg["max_new_tokens"]
    greedy_out: list[list[Completion]] | list[None] = [None] * len(rows)
    if greedy:
        greedy_out = generator.generate(
            prompts, n=1, temperature=0.0, top_p=1.0, max_new_tokens=budget, seed=seed
        )
    k = eval_cfg["n_samples"]
    sampled_out = generator.generate(
        prompts,
        n=k,
        temperature=eval_cfg["temperature"],
        top_p=eval_cfg["top_p"],
        max_new_tokens=budget,
        seed=seed,
    )
    keep = bool(eval_cfg["keep_completions"])
    records = [
        problem_record(row, g[0] if g else None, samples, exit_string, keep)
        for row, g, samples in zip(rows, greedy_out, sampled_out, strict=True)
    ]
    return records, summarize(records, k)


def _grade(text: str, gold: str, exit_string: str | None) -> tuple[str | None, bool]:
    """Extracted answer and its correctness (the same rule as :func:`rredcot.data.grading.grade`)."""
    pred = extract_answer(text, exit_string)
    return pred, pred is not None and answers_equivalent(gold, pred)


def problem_record(
    row: Mapping[str, Any],
    greedy: Completion | None,
    samples: Sequence[Completion],
    exit_string: str | None,
    keep_completions: bool,
) -> dict[str, Any]:
    """One problem's results: answers, correctness and lengths (tokens) of every completion."""
    gold = str(row["answer"])
    graded = [_grade(s.text, gold, exit_string) for s in samples]
    record: dict[str, Any] = {"id": row["id"], "benchmark": benchmark_of(row), "answer": gold}
    if greedy is not None:
        pred, correct = _grade(greedy.text, gold, exit_string)
        # The greedy completion is always kept: the credit-view CLI reads traces from it.
        record |= {
            "greedy_completion": greedy.text,
            "greedy_pred": pred,
            "greedy_correct": correct,
            "greedy_tokens": greedy.n_tokens,
            "greedy_truncated": greedy.truncated,
        }
    record |= {
        "sample_preds": [pred for pred, _ in graded],
        "sample_correct": [correct for _, correct in graded],
        "sample_tokens": [s.n_tokens for s in samples],
        "sample_truncated": [s.truncated for s in samples],
    }
    if keep_completions:
        record["sample_completions"] = [s.text for s in samples]
    return record


def summarize(records: Sequence[Mapping[str, Any]], k: int) -> dict[str, dict[str, float]]:
    """Aggregate per benchmark and over everything (``all``).

    ``greedy`` appears only when the records have a greedy pass. ``mean_tokens`` and ``truncated``
    describe the sampled completions: a rise in truncation explains an accuracy drop at a fixed budget.
    """
    groups: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for rec in records:
        groups[rec["benchmark"]].append(rec)
        groups["all"].append(rec)
    summary = {}
    for name, recs in sorted(groups.items()):
        n = len(recs)
        stats: dict[str, float] = {"n": n}
        if all("greedy_correct" in r for r in recs):
            stats["greedy"] = sum(r["greedy_correct"] for r in recs) / n
        if k == 0:  # greedy only (a probe): no samples to describe
            summary[name] = stats
            continue
        stats[f"avg@{k}"] = sum(_mean(r["sample_correct"]) for r in recs) / n
        stats[f"pass@{k}"] = sum(any(r["sample_correct"]) for r in recs) / n
        if all("sample_tokens" in r for r in recs):
            stats["mean_tokens"] = sum(_mean(r["sample_tokens"]) for r in recs) / n
            stats["truncated"] = sum(_mean(r["sample_truncated"]) for r in recs) / n
        summary[name] = stats
    return summary


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def load_benchmarks(paths: Sequence[str | Path], max_problems: int | None) -> list[dict[str, Any]]:
    """Rows of every data file, the first ``max_problems`` of each.

    A row without a ``source`` is named after its file, so every benchmark keeps its own summary.
    """
    rows = []
    for path in paths:
        part = read_jsonl(path)[:max_problems] if max_problems else read_jsonl(path)
        for row in part:
            row.setdefault("source", Path(path).name.split(".")[0])
        rows.extend(part)
    return rows
