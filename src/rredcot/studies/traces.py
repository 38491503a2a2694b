"""Study traces: one sampled completion per problem, graded, with its RREDCoT credit.

    rredcot study-traces --config C --set analysis|prm|localisation|prm_analysis --model DIR \\
        --data test.jsonl [more.jsonl ...] --out traces.jsonl

Every setting comes from the config (``rredcot.settings.reads``, stage ``study_traces``): the set
names which one of the config's trace sets this is (:data:`TRACE_SETS`): its size, and its seed,
``studies.seed`` plus the set's place there. Problems are drawn deterministically from that seed,
in turn from every (benchmark, level) stratum so that easy and hard problems are both represented.
Each completion is sampled with the config's ``prompt`` section and ``studies`` sampling settings
(its own seed is derived from the set's seed and the problem id) and graded with math-verify. Its
credit is computed by :class:`rredcot.method.assign.CreditAssigner` with the ``rredcot`` method, the
config's ``credit`` settings and the model itself as value model; the advantage is +1 for a correct
completion and -1 for a wrong one, so σ says where the credit or the blame goes.

One JSON line per trace (the shared input of every study; all token indices are into the completion):

    trace_id, problem_id, source, benchmark, level, prompt, answer (gold), reference (solution or ""),
    prompt_ids, completion_ids, tokens (text of each completion token), completion (text), pred,
    correct, truncated, exit_token (where the model's own exit string starts, or null), advantage,
    method, mix, model (the --model path), seed, temperature, top_p,
    segment_starts   the thinking segments, then the answer segment when the model exits
    cuts             the exit points: segment starts of the thinking part, then the model's own exit
                     (or the end of the trace when it never exits); len(cuts) = len(log_values)
    log_values       log v̂ at each cut; thought_nll, answer_nll: -log p(u_ref|s), -log p(y_ref|u_ref,s)
    answer_reward    the answer segment's log value ratio (own final solution over the value
                     at the exit; null without one)
    segment_rewards  r̂ per segment as σ used them (credit.value_space), the answer segment's last
    sigma, entropies per completion token (σ sums to 1)
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import random
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from tqdm.auto import tqdm

from rredcot.data.grading import answers_equivalent, extract_answer
from rredcot.data.records import build_prompt, reference_solution
from rredcot.infra.io import write_jsonl
from rredcot.infra.logs import setup_logging
from rredcot.lm.evaluation import benchmark_of, load_benchmarks
from rredcot.lm.generation import Completion, HFGenerator, sample_seed
from rredcot.lm.modeling import load_model, load_tokenizer, set_threads
from rredcot.method.assign import CreditAssigner, TraceCredit, credit_record
from rredcot.method.registry import TraceInput
from rredcot.method.segmentation import thinking_end
from rredcot.settings.config import rredcot_credit
from rredcot.settings.reads import stage_config

_log = logging.getLogger(__name__)


def sample_problems(rows: Sequence[Mapping[str, Any]], n: int, seed: int) -> list[Mapping[str, Any]]:
    """``n`` rows, deterministic in ``seed``, taken in turn from each (source, level) stratum.

    Strata are visited in sorted order, each shuffled by its own seeded stream, so a stratum's picks do
    not depend on the others; a stratum that runs out is skipped. When ``n`` exceeds the rows, every row
    is taken and the draw starts over in the same order, so each problem is taken as often as the
    others, give or take one: a study sized beyond a small held-out set (a correlation that needs more
    segments than 400 problems give) samples more traces of the same problems (``trace_seeds`` gives
    each draw of a problem its own sampling seed).
    """
    strata: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        strata[(str(row.get("source") or ""), str(row.get("level") or ""))].append(row)
    queues = []
    for key in sorted(strata):
        members = sorted(strata[key], key=lambda r: str(r["id"]))
        random.Random(sample_seed(seed, *key)).shuffle(members)
        queues.append(members)
    picked: list[Mapping[str, Any]] = []
    while len(picked) < n and any(queues):
        depth = 0
        while len(picked) < n and any(depth < len(q) for q in queues):
            picked += [q[depth] for q in queues if depth < len(q)][: n - len(picked)]
            depth += 1
    return picked


def trace_seeds(rows: Sequence[Mapping[str, Any]], seed: int) -> list[int]:
    """The sampling seed of each drawn row's trace: (seed, "trace", problem id) for a problem's first
    draw, as it always was, and (seed, "trace", problem id, k) for its k-th repeat."""
    seen: dict[str, int] = defaultdict(int)
    out = []
    for row in rows:
        key = str(row["id"])
        k = seen[key]
        seen[key] += 1
        out.append(
            sample_seed(seed, "trace", row["id"]) if k == 0 else sample_seed(seed, "trace", row["id"], k)
        )
    return out


# The trace sets, in the order that gives each its seed (studies.seed plus its place here), and the
# setting that sizes each: held-out problems for the analyses and the localisation study, the RL
# split for training the local PRM, the study split's fresh problems for the PRM study (one trace
# each, when studies.prm.analysis_problems is set).
TRACE_SETS: dict[str, tuple[str, ...]] = {
    "analysis": ("studies", "n_traces"),
    "prm": ("studies", "prm", "n_traces"),
    "localisation": ("studies", "localisation_traces"),
    "prm_analysis": ("studies", "prm", "analysis_problems"),
}


def trace_set(cfg: Mapping[str, Any], name: str) -> tuple[int, int]:
    """(number of traces, seed) of the trace set ``name``."""
    node: Any = cfg
    for key in TRACE_SETS[name]:
        node = node[key]
    return int(node), int(cfg["studies"]["seed"]) + list(TRACE_SETS).index(name)


def trace_record(
    row: Mapping[str, Any],
    index: int,
    prompt: str,
    prompt_ids: list[int],
    rollout: Completion,
    pred: str | None,
    assigner: CreditAssigner,
    credit: TraceCredit,
) -> dict[str, Any]:
    """The JSON line of one trace (see the module docstring); ``pred`` is its extracted answer."""
    gold = str(row["answer"])
    advantage = 1.0 if pred is not None and answers_equivalent(gold, pred) else -1.0
    tokens = assigner.token_texts(rollout.token_ids)
    base = credit_record(
        tokens,
        credit,
        assigner.cfg.method,
        None,
        f"t{index:05d}",
        prompt,
        gold,
        advantage,
        baseline_text=assigner.baseline_text(credit),
    )
    rewards = credit.segment_rewards.tolist()
    return {
        "trace_id": base["trace_id"],
        "problem_id": str(row["id"]),
        "source": str(row.get("source") or ""),
        "benchmark": benchmark_of(row),
        "level": row.get("level"),
        "prompt": prompt,
        "answer": gold,
        "reference": reference_solution(row.get("solution")) or "",
        "prompt_ids": prompt_ids,
        "completion_ids": rollout.token_ids,
        "tokens": tokens,
        "completion": rollout.text,
        "pred": pred,
        "correct": advantage > 0,
        "truncated": rollout.truncated,
        "exit_token": thinking_end(tokens, assigner.cfg.exit_string),
        "advantage": advantage,
        "method": base["method"],
        "mix": assigner.cfg.mix,
        "segment_starts": base["segment_starts"],
        "cuts": base["cuts"],
        "log_values": base["log_values"],
        "thought_nll": base["thought_nll"],
        "answer_nll": base["answer_nll"],
        "answer_reward": base["answer_reward"],
        "answer_baseline": base["answer_baseline"],
        "segment_rewards": [float(r) for r in rewards],
        "sigma": base["sigma"],
        "entropies": base["entropies"],
    }


def main(argv: Sequence[str] | None = None) -> None:
    from rredcot.infra.tracking import stage_run

    ap = argparse.ArgumentParser(
        prog="rredcot study-traces", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--config", nargs="+", required=True, help="config YAML file(s): every setting")
    ap.add_argument("--set", required=True, choices=tuple(TRACE_SETS), help="which set of traces")
    ap.add_argument("--model", required=True, help="model directory (policy and value model)")
    ap.add_argument("--data", nargs="+", required=True, help="problem JSONL file(s), one benchmark each")
    ap.add_argument("--out", required=True, help="trace file (JSONL)")
    ap.add_argument("--arm", help="arm whose credit options to use (method is always rredcot)")
    ap.add_argument("--batch-size", type=int, default=64, help="sequences per generation batch")
    ap.add_argument("--credit-batch", type=int, default=16, help="traces per credit-assignment call")
    args = ap.parse_args(argv)

    cfg = stage_config(args.config, "study_traces")
    set_threads(cfg["threads"]["eval"])
    studies = cfg["studies"]
    n_traces, seed = trace_set(cfg, args.set)
    sampling = {k: studies[k] for k in ("temperature", "top_p", "max_new_tokens")}
    credit_cfg = rredcot_credit(cfg, args.arm)
    rows = sample_problems(load_benchmarks(args.data, None), n_traces, seed)
    params = {k: v for k, v in vars(args).items() if k != "config"} | sampling
    params |= {"n_traces": n_traces, "seed": seed, "credit": dataclasses.asdict(credit_cfg)}
    with stage_run(cfg, f"study-traces-s{seed}", rule="study_traces", seed=seed, params=params) as run:
        t0 = time.time()
        tok = load_tokenizer(args.model)
        model = load_model(args.model, cfg["model"]["dtype"]).eval()
        if torch.cuda.is_available():
            model = model.to("cuda")
        assigner = CreditAssigner(tok, credit_cfg)
        prompts = [build_prompt(cfg["prompt"], r["problem"], tok) for r in rows]
        prompt_ids = [assigner.encode(p) for p in prompts]
        sampler = HFGenerator(model, tok, batch_size=args.batch_size, progress=True)
        rollouts = sampler.sample(prompt_ids, trace_seeds(rows, seed), **sampling)
        t_gen = time.time() - t0
        exit_string = cfg["prompt"]["exit_string"]
        records = []
        with torch.inference_mode():
            for start in tqdm(range(0, len(rows), args.credit_batch), desc="credit", unit="batch"):
                part = range(start, min(start + args.credit_batch, len(rows)))
                preds = [extract_answer(rollouts[i].text, exit_string) for i in part]
                items = []
                for i, pred in zip(part, preds, strict=True):
                    right = pred is not None and answers_equivalent(str(rows[i]["answer"]), pred)
                    pair = (reference_solution(rows[i].get("solution")) or "", str(rows[i]["answer"]))
                    items.append(
                        TraceInput(prompt_ids[i], rollouts[i].token_ids, 1.0 if right else -1.0, [pair])
                    )
                credits = assigner.assign(model, items)
                for i, pred, tc in zip(part, preds, credits, strict=True):
                    extra = {
                        "model": args.model,
                        "seed": seed,
                        "temperature": sampling["temperature"],
                        "top_p": sampling["top_p"],
                    }
                    records.append(
                        trace_record(rows[i], i, prompts[i], prompt_ids[i], rollouts[i], pred, assigner, tc)
                        | extra
                    )
        write_jsonl(args.out, records)
        wall = time.time() - t0
        n = max(len(records), 1)
        run.log_metrics(
            {
                "traces": len(records),
                "accuracy": sum(r["correct"] for r in records) / n,
                "mean_tokens": sum(len(r["completion_ids"]) for r in records) / n,
                "mean_exit_points": sum(len(r["cuts"]) for r in records) / n,
                "exited": sum(r["exit_token"] is not None for r in records) / n,
                "generate_seconds": t_gen,
                "credit_seconds": wall - t_gen,
                "wall_seconds": wall,
            }
        )
        run.log_artifact(args.out)
        _log.info(
            f"{len(records)} traces, accuracy {sum(r['correct'] for r in records) / n:.3f}, "
            f"{sum(len(r['cuts']) for r in records) / n:.1f} exit points per trace; "
            f"generation {t_gen:.1f}s, credit {wall - t_gen:.1f}s -> {args.out}",
        )


if __name__ == "__main__":
    setup_logging()
    main()
