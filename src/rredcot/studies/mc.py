"""Monte Carlo values at the exit points of study traces: the unbiased baseline RREDCoT approximates.

    rredcot study-mc --config C --model DIR --traces traces.jsonl --out mc.jsonl [--stats S.json]

For every trace and every exit point ``c`` (its ``cuts``), M continuations of ``prompt ⊕ completion[:c]``
are sampled with a generous budget B: the model keeps thinking, then answers. Every setting comes
from the config (``rredcot.settings.reads``, stage ``study_mc``): M = ``studies.mc_samples``, B =
``studies.mc_max_new_tokens``, the sampling settings and the backend of ``studies``. Each is graded with
math-verify (the text graded is ``completion[:c]`` plus the continuation, as evaluation grades a
completion), and the MC value is their mean correctness. Every sample has its own seed, derived from
``studies.seed``, the trace id, the exit index and the sample index, so a point's rollouts do not depend on
the rest of the run.

Truncation (Figure 3) is read from the same generations: ``answer_token`` is the number of generated
tokens after which the final answer (the last ``\\boxed{}`` after the exit string, the one graded at
B) is complete. Truncated at T, a rollout is *lost* when ``answer_token`` is null or > T; a lost
rollout with ``correct`` true would have been correct had it been continued (known up to B).

One JSON line per (trace, exit point):

    trace_id, problem_id, benchmark, level, exit_index, n_exits, cut (completion tokens before the exit),
    n_tokens_prefix (prompt + cut), model, samples, max_new_tokens, temperature, top_p, seed,
    rollouts: [{n_tokens, truncated, answer (extracted or null), correct, answer_token}, ...],
    mc_value (mean correctness at B), n_answered (answer within B)

Compute (rollouts, generated tokens, wall time, device) is logged to MLflow and, with ``--stats``,
written as JSON for the captions of Figure 3.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from tqdm.auto import tqdm

from rredcot.infra.io import read_jsonl, write_json, write_jsonl
from rredcot.infra.logs import setup_logging
from rredcot.lm.generation import VLLMOptions, device_name, make_generator, sample_seed
from rredcot.lm.modeling import load_tokenizer, set_threads
from rredcot.lm.rollouts import rollout_record
from rredcot.settings.reads import stage_config

_log = logging.getLogger(__name__)


def exit_points(traces: Sequence[Mapping[str, Any]]) -> list[tuple[Mapping[str, Any], int, int]]:
    """(trace, exit index, cut) for every exit point of every trace, in file order."""
    return [(t, i, int(c)) for t in traces for i, c in enumerate(t["cuts"])]


def main(argv: Sequence[str] | None = None) -> None:
    from rredcot.infra.tracking import stage_run

    ap = argparse.ArgumentParser(
        prog="rredcot study-mc", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--config", nargs="+", required=True, help="config YAML file(s): every setting")
    ap.add_argument("--model", required=True, help="model directory (the policy that wrote the traces)")
    ap.add_argument("--traces", required=True, help="study traces (rredcot study-traces)")
    ap.add_argument("--out", required=True, help="Monte Carlo records (JSONL)")
    ap.add_argument("--limit", type=int, help="only the first N traces")
    ap.add_argument("--batch-size", type=int, default=160, help="rows per transformers generate batch")
    ap.add_argument("--keep-text", action="store_true", help="keep each continuation's text")
    ap.add_argument("--stats", help="also write the compute (rollouts, tokens, seconds, device) as JSON")
    args = ap.parse_args(argv)

    cfg = stage_config(args.config, "study_mc")
    set_threads(cfg["threads"]["eval"])
    studies = cfg["studies"]
    m, budget, seed, backend = (studies[k] for k in ("mc_samples", "mc_max_new_tokens", "seed", "backend"))
    sampling = {"temperature": studies["temperature"], "top_p": studies["top_p"], "max_new_tokens": budget}
    exit_string = cfg["prompt"]["exit_string"]
    traces = read_jsonl(args.traces)[: args.limit]
    points = exit_points(traces)
    params = {k: v for k, v in vars(args).items() if k != "config"}
    params |= sampling | {"samples": m, "seed": seed, "backend": backend, "points": len(points)}
    options = VLLMOptions.from_config(cfg["eval"]["vllm"], cfg["vllm_cpu"], cfg["model"]["dtype"])
    if backend == "vllm":
        params["engine"] = asdict(options)
    with stage_run(cfg, f"study-mc-s{seed}", rule="study_mc", seed=seed, params=params) as run:
        t0 = time.time()
        tok = load_tokenizer(args.model)
        sampler = make_generator(
            backend,
            args.model,
            tok,
            dtype=cfg["model"]["dtype"],
            batch_size=args.batch_size,
            options=options,
        )
        t_load = time.time() - t0
        prefixes, seeds = [], []
        for t, i, cut in points:
            prefixes += [t["prompt_ids"] + t["completion_ids"][:cut]] * m
            seeds += [sample_seed(seed, t["trace_id"], i, j) for j in range(m)]
        _log.info(f"{len(traces)} traces, {len(points)} exit points, {len(seeds)} rollouts")
        rollouts = sampler.sample(prefixes, seeds, **sampling)
        t_sample = time.time() - t0 - t_load

        def decode(ids: list[int]) -> str:
            return tok.decode(ids, skip_special_tokens=True)

        records = []
        for k, (t, i, cut) in enumerate(tqdm(points, desc="grade", unit="point")):
            prefix_text = decode(t["completion_ids"][:cut])
            rows = [
                rollout_record(prefix_text, r, str(t["answer"]), decode, exit_string, args.keep_text)
                for r in rollouts[k * m : (k + 1) * m]
            ]
            records.append(
                {
                    "trace_id": t["trace_id"],
                    "problem_id": t.get("problem_id"),
                    "benchmark": t.get("benchmark"),
                    "level": t.get("level"),
                    "exit_index": i,
                    "n_exits": len(t["cuts"]),
                    "cut": cut,
                    "n_tokens_prefix": len(t["prompt_ids"]) + cut,
                    "model": args.model,
                    "samples": m,
                    "max_new_tokens": budget,
                    "temperature": sampling["temperature"],
                    "top_p": sampling["top_p"],
                    "seed": seed,
                    "rollouts": rows,
                    "mc_value": sum(r["correct"] for r in rows) / max(m, 1),
                    "n_answered": sum(r["answer_token"] is not None for r in rows),
                }
            )
        write_jsonl(args.out, records)
        wall = time.time() - t0
        n_points, n_rollouts = max(len(records), 1), max(len(rollouts), 1)
        generated = sum(len(r.token_ids) for r in rollouts)
        stats = {
            "traces": len(traces),
            "points": len(records),
            "rollouts": len(rollouts),
            "generated_tokens": generated,
            "load_seconds": t_load,
            "sample_seconds": t_sample,
            "grade_seconds": wall - t_load - t_sample,
            "wall_seconds": wall,
            "seconds_per_point": t_sample / n_points,
            "tokens_per_point": generated / n_points,
            "tokens_per_second": generated / max(t_sample, 1e-9),
            "mean_mc_value": sum(r["mc_value"] for r in records) / n_points,
            "lost_at_budget": sum(m - r["n_answered"] for r in records) / n_rollouts,
        }
        run.log_metrics(stats)
        run.set_tags({"rredcot.device": device_name(), "rredcot.backend": backend})
        if args.stats:
            write_json(args.stats, stats | {"device": device_name(), "backend": backend})
            run.log_artifact(args.stats)
        run.log_artifact(args.out)
        t_grade = wall - t_load - t_sample
        _log.info(
            f"{len(records)} points x {m} rollouts: {generated} tokens in {t_sample:.1f}s "
            f"({t_sample / n_points:.2f}s per point), graded in {t_grade:.1f}s -> {args.out}",
        )


if __name__ == "__main__":
    setup_logging()
    main()
