"""vLLM against transformers on one saved model, with one engine in one process (vLLM's CPU build).

Run by tests/test_vllm.py as ``python tests/vllm_checks.py MODEL DATA OUT.json``; writes what it
measured, and the test asserts on it. A process of its own: a vLLM engine on a CPU runs in the
calling process and sets up torch.distributed there, which the test process must not inherit.

1. evaluation (``VLLMGenerator.generate`` against ``HFGenerator.generate``): greedy completions of
   every problem, token by token; sampled accuracy (avg@k) of each with a bootstrap interval over
   problems;
2. Monte Carlo rollouts (``sample`` from token-id prefixes at exit points of sampled traces, the
   prompt and the ends of the first two lines): greedy continuations token by token, sampled values
   (mean correctness) with intervals;
3. RREDCoT's greedy answer baseline: σ of sampled traces with the solutions written by the engine
   (``EngineDecoder``) against transformers' own decoding: the same solutions, answer log-probabilities
   and σ; the seconds of each;
4. weight updates (``load_weights``): the engine given perturbed weights decodes as transformers does
   with them, and given the originals back as before.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from rredcot.adapter.engine import EngineDecoder
from rredcot.data.records import build_prompts, reference_solution
from rredcot.infra.io import read_jsonl
from rredcot.lm.evaluation import evaluate_with, summarize
from rredcot.lm.generation import HFGenerator, VLLMGenerator, VLLMOptions, sample_seed
from rredcot.lm.modeling import load_model, load_tokenizer
from rredcot.lm.rollouts import rollout_record
from rredcot.lm.vllm_engine import load_weights
from rredcot.method.assign import CreditAssigner
from rredcot.method.registry import TraceInput
from rredcot.settings.config import credit_config, load_config

ROOT = Path(__file__).resolve().parents[1]
K = 12  # samples per problem (evaluation) and per exit point (rollouts)
ROLLOUT_TRACES = 40  # traces whose exit points (the prompt and the ends of the first two lines) roll out


def interval(per_item: list[float], seed: int = 0) -> list[float]:
    """Mean and 95% bootstrap interval of a mean over items."""
    x = np.asarray(per_item, dtype=float)
    draws = np.random.default_rng(seed).choice(x, size=(4000, len(x))).mean(axis=1)
    return [float(x.mean()), float(np.percentile(draws, 2.5)), float(np.percentile(draws, 97.5))]


def same_tokens(a: list, b: list) -> int:
    return sum(x.token_ids == y.token_ids for x, y in zip(a, b, strict=True))


def credit_traces(hf: HFGenerator, tok, rows: list[dict], prompts: list[str]) -> list[TraceInput]:  # noqa: ANN001
    """Two sampled traces of every problem, with its reference pair, one blamed and one credited."""
    items = []
    for i, (row, p) in enumerate(zip(rows, prompts, strict=True)):
        ids = tok(p, add_special_tokens=False)["input_ids"]
        pairs = [(reference_solution(row.get("solution")) or "", str(row["answer"]))]
        for m, c in enumerate(
            hf.generate([p], n=2, temperature=1.0, top_p=1.0, max_new_tokens=160, seed=i)[0]
        ):
            items.append(TraceInput(ids, c.token_ids, 1.0 if m % 2 else -1.0, pairs))
    return items


def compare_baselines(model, tok, items: list[TraceInput], credit, decoder) -> dict:  # noqa: ANN001
    """RREDCoT's credit of ``items`` with the greedy baseline's solutions written by ``decoder``
    against transformers' own decoding: how many agree, and the seconds of each."""
    with torch.inference_mode():
        ref_assigner, eng_assigner = CreditAssigner(tok, credit), CreditAssigner(tok, credit)
        t0 = time.perf_counter()
        ref = ref_assigner.assign(model, items)
        hf_seconds = time.perf_counter() - t0
        t0 = time.perf_counter()
        via = eng_assigner.assign(model, items, decoder=decoder)
        engine_seconds = time.perf_counter() - t0
    judged = [j for j, c in enumerate(ref) if c.baseline_solution is not None]
    own = [j for j in judged if ref[j].answer_reward == 0.0]  # the greedy solution is the trace's own
    return {
        "traces": len(items),
        "with_answer_segment": len(judged),
        "decoded": len(judged) - len(own),
        "solutions_identical": sum(ref[j].baseline_solution == via[j].baseline_solution for j in judged),
        "max_answer_reward_difference": max(
            (abs(ref[j].answer_reward - via[j].answer_reward) for j in judged), default=0.0
        ),
        "max_sigma_difference": max(
            float((r.multiplier - v.multiplier).abs().max()) for r, v in zip(ref, via, strict=True)
        ),
        "seconds": {
            "transformers": {"credit": hf_seconds, **ref_assigner.seconds},
            "engine": {"credit": engine_seconds, **eng_assigner.seconds},
        },
    }


def main(model_dir: str, data: str, out: str) -> None:
    torch.set_num_threads(1)  # it runs beside other jobs (tests/test_vllm.py)
    cfg = load_config(ROOT / "config/config.yaml", {"model": {"dtype": "float32"}})
    prompt, exit_string = cfg["prompt"], cfg["prompt"]["exit_string"]
    tok = load_tokenizer(model_dir)
    model = load_model(model_dir, "float32").eval()
    rows = read_jsonl(data)
    prompts = build_prompts(prompt, [r["problem"] for r in rows], tok)
    report: dict = {"problems": len(rows)}

    t0 = time.perf_counter()
    options = VLLMOptions.from_config(cfg["eval"]["vllm"], cfg["vllm_cpu"], "float32")
    engine = VLLMGenerator(model_dir, tok, options)
    report["engine_start_seconds"] = time.perf_counter() - t0
    hf = HFGenerator(model, tok, batch_size=64)

    # 1. Evaluation: greedy token by token, sampled accuracy with intervals.
    greedy = {"temperature": 0.0, "top_p": 1.0, "max_new_tokens": 160, "seed": 0}
    v_greedy = [c[0] for c in engine.generate(prompts, n=1, **greedy)]
    h_greedy = [c[0] for c in hf.generate(prompts, n=1, **greedy)]
    report["eval_greedy_identical"] = same_tokens(v_greedy, h_greedy)
    report["eval_greedy_first_differences"] = [
        {"problem": i, "vllm": v.token_ids, "hf": h.token_ids}
        for i, (v, h) in enumerate(zip(v_greedy, h_greedy, strict=True))
        if v.token_ids != h.token_ids
    ][:3]
    eval_cfg = {"n_samples": K, "temperature": 1.0, "top_p": 1.0, "max_new_tokens": 160, "greedy": False}
    eval_cfg |= {"keep_completions": False}
    sampled = {}
    for name, gen in (("vllm", engine), ("hf", hf)):
        t0 = time.perf_counter()
        records, _ = evaluate_with(gen, tok, rows, prompt, eval_cfg, seed=1, greedy=False)
        per_problem = [float(np.mean(r["sample_correct"])) for r in records]
        sampled[name] = {
            "avg": interval(per_problem),
            "per_problem": per_problem,
            "seconds": time.perf_counter() - t0,
            "summary": summarize(records, K)["all"],
        }
    report["eval_sampled"] = sampled

    # 2. Monte Carlo rollouts from exit points of sampled traces (a trace's first lines).
    traces = [c[0] for c in hf.generate(prompts, n=1, temperature=1.0, top_p=1.0, max_new_tokens=160, seed=7)]
    points = []  # (row, prefix ids, cut)
    for i, (p, trace) in enumerate(zip(prompts[:ROLLOUT_TRACES], traces, strict=False)):
        ids = tok(p, add_special_tokens=False)["input_ids"]
        lines = [j + 1 for j, t in enumerate(trace.token_ids) if "\n" in tok.decode([t])]
        for cut in [0, *lines[:2]]:
            points.append((i, ids + trace.token_ids[:cut], cut))
    prefixes = [p for _, p, _ in points]
    report["rollout_points"] = len(points)
    gv = engine.sample(prefixes, [0] * len(prefixes), temperature=0.0, top_p=1.0, max_new_tokens=120)
    gh = hf.sample(prefixes, [0] * len(prefixes), temperature=0.0, top_p=1.0, max_new_tokens=120)
    report["rollout_greedy_identical"] = same_tokens(gv, gh)
    rollouts = {}
    seeds = [sample_seed(3, k, m) for k in range(len(points)) for m in range(K)]
    many = [p for p in prefixes for _ in range(K)]
    for name, gen in (("vllm", engine), ("hf", hf)):
        t0 = time.perf_counter()
        outs = gen.sample(many, seeds, temperature=1.0, top_p=1.0, max_new_tokens=120)
        values = []
        for k, (i, _, cut) in enumerate(points):
            head = tok.decode(traces[i].token_ids[:cut], skip_special_tokens=True)
            graded = [
                rollout_record(head, o, str(rows[i]["answer"]), tok.decode, exit_string)["correct"]
                for o in outs[k * K : (k + 1) * K]
            ]
            values.append(float(np.mean(graded)))
        rollouts[name] = {"value": interval(values), "per_point": values, "seconds": time.perf_counter() - t0}
    report["rollouts_sampled"] = rollouts

    # 3. The greedy answer baseline: solutions written by the engine against transformers' own.
    items = credit_traces(hf, tok, rows, prompts)
    report["baseline"] = compare_baselines(
        model, tok, items, credit_config(cfg, "rredcot"), EngineDecoder(engine.llm)
    )

    # 4. Weight updates: perturbed weights in, then the originals back.
    moved = copy.deepcopy(model)
    torch.manual_seed(0)
    with torch.no_grad():
        for param in moved.parameters():
            param.add_(0.05 * torch.randn_like(param))
    load_weights(engine.llm, moved.named_parameters())
    after = [c[0] for c in engine.generate(prompts, n=1, **greedy)]
    moved_hf = [c[0] for c in HFGenerator(moved, tok, batch_size=64).generate(prompts, n=1, **greedy)]
    load_weights(engine.llm, model.named_parameters())
    back = [c[0] for c in engine.generate(prompts, n=1, **greedy)]
    report["weights"] = {
        "changed": len(prompts) - same_tokens(after, v_greedy),
        "identical_to_transformers": same_tokens(after, moved_hf),
        "restored": same_tokens(back, v_greedy),
    }
    Path(out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:4])
