"""Four credits for every thinking segment of a trace: RREDCoT, leave-one-out, gradient norm and Monte Carlo.

The paper compares RREDCoT's segment rewards with classic attribution methods and with Monte Carlo
value differences (docs/method.md, "The analyses (Figures 3-7)", Figure 4). For a trace with exit points
``cuts = [c_0 = 0, …, c_K = e]`` (``e``: where the model itself exits), thinking segment k is
``completion[c_k:c_{k+1}]``.
The answer segment after ``e`` has no MC value on either side and is left out. With the reference
pair ``(u_ref, y_ref)`` and the config's exit/answer strings, the full sequence is

    F   = prompt ⊕ completion[:e] ⊕ exit ⊕ u_ref ⊕ answer_prefix ⊕ y_ref ⊕ answer_suffix

(the last exit point of the RREDCoT scorer). Per segment k:

- ``rredcot``: r̂_k, the segment reward σ was computed from (``credit.value_space``: the change of
  value or of log value from exit k to exit k+1), read from the traces file.
- ``loo`` (leave-one-out): the same sequence with segment k cut out,
  ``D_k = prompt ⊕ completion[:c_k] ⊕ completion[c_{k+1}:e] ⊕ exit ⊕ u_ref ⊕ …``, and
  ``loo_k = log p(y_ref | u_ref, F) − log p(y_ref | u_ref, D_k)``: how much the reference answer's
  log-likelihood drops without the segment (positive: the segment helps). ``loo_value`` is the same
  difference for log v̂ = log p(u_ref|s) + log p(y_ref|u_ref,s) (thought and answer NLL together).
  Both are scored by the teacher-forcing scorer of ``rredcot.method.scoring.naive``.
- ``grad_norm``: with x_t the input embedding of token t of F, the L2 norm ‖∂ log p(y_ref | u_ref, F)
  / ∂x_t‖ summed over the segment's tokens (the segment's total sensitivity, like LOO which removes
  the whole segment; ``grad_norm_mean`` is the per-token mean). It is a magnitude: never negative.
  ``grad_norm_value`` differentiates log v̂ instead (thought and answer likelihood together).
- ``mc``: mc_value(exit k+1) − mc_value(exit k) from the Monte Carlo file (M rollouts per exit).

Notes:

- For the last thinking segment D_{K−1} *is* the sequence read at exit K−1, so with N = 1 reference
  pair ``loo_value_{K−1} = r̂_{K−1}`` exactly: late in the trace LOO on log v̂ and RREDCoT agree by
  construction, not as a finding.
- Why the ``…_value`` variants: the method names the answer log-likelihood, but when the reference
  solution already states the answer (the synthetic task: "… 6 + 2 = 8." then ``\\boxed{8}``),
  p(y_ref | u_ref, s) ≈ 1 at every exit and nearly all of RREDCoT's signal sits in the thought NLL.

CLI: ``rredcot study-attribution --config C --model DIR --traces traces.jsonl --mc mc.jsonl
--out attributions.jsonl [--figures DIR] [--limit N]``. One output line per (trace, thinking segment).
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from tqdm import tqdm

from rredcot.infra.logs import setup_logging
from rredcot.method.forward import model_device
from rredcot.method.scoring.naive import Job, chunk_jobs, make_jobs, score_jobs
from rredcot.method.scoring.types import ExitStrings

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AttrInput:
    """One trace in token ids: its exit points and its (first) reference pair."""

    prompt_ids: list[int]
    completion_ids: list[int]
    cuts: list[int]  # K+1 exit points; cuts[-1] is where the model exits
    solution_ids: list[int]
    answer_ids: list[int]

    @property
    def n_segments(self) -> int:
        return max(len(self.cuts) - 1, 0)


def _full_job(item: AttrInput, strings: ExitStrings) -> Job:
    """The sequence F read at the model's own exit."""
    return make_jobs(
        item.prompt_ids,
        item.completion_ids,
        [item.cuts[-1]],
        [(item.solution_ids, item.answer_ids)],
        strings.exit_ids,
        strings.answer_prefix_ids,
        strings.answer_suffix_ids,
    )[0]


def _drop_jobs(item: AttrInput, strings: ExitStrings) -> list[Job]:
    """The sequences D_k: the thinking part without segment k, then the exit and the reference pair."""
    jobs = []
    cuts, thinking = item.cuts, item.completion_ids[: item.cuts[-1]]
    for k in range(item.n_segments):
        kept = thinking[: cuts[k]] + thinking[cuts[k + 1] :]
        jobs += make_jobs(
            item.prompt_ids,
            kept,
            [len(kept)],
            [(item.solution_ids, item.answer_ids)],
            strings.exit_ids,
            strings.answer_prefix_ids,
            strings.answer_suffix_ids,
        )
    return jobs


def leave_one_out(
    model: torch.nn.Module,
    items: Sequence[AttrInput],
    strings: ExitStrings,
    max_batch_tokens: int,
    progress: bool = False,
) -> list[tuple[list[float], list[float]]]:
    """Per trace: (loo_k, loo_value_k) for every thinking segment (see the module docstring).

    All K+1 sequences of a group of traces share the batching budget of ``score_jobs``; groups of
    traces are only there for the progress bar.
    """
    out: list[tuple[list[float], list[float]]] = []
    group = 16
    for start in tqdm(range(0, len(items), group), desc="leave-one-out", unit="traces", disable=not progress):
        part = items[start : start + group]
        jobs: list[Job] = []
        bounds = []
        for item in part:
            a = len(jobs)
            jobs += [_full_job(item, strings), *_drop_jobs(item, strings)] if item.n_segments else []
            bounds.append((a, len(jobs)))
        lps, lpa = score_jobs(model, jobs, max_batch_tokens) if jobs else (torch.zeros(0), torch.zeros(0))
        for a, b in bounds:
            if a == b:
                out.append(([], []))
                continue
            answer = lpa[a:b].double()
            value = answer + lps[a:b].double()
            out.append(((answer[0] - answer[1:]).tolist(), (value[0] - value[1:]).tolist()))
    return out


OBJECTIVES = ("answer", "value")
"""What the gradient differentiates: log p(y_ref | u_ref, F), or log v̂ = that plus log p(u_ref | F)."""


def _target_positions(job: Job, objective: str) -> list[int]:
    """Positions whose logits predict the objective's tokens (position p predicts token p + 1)."""
    answer = range(job.answer_start - 1, job.answer_start - 1 + job.answer_len)
    if objective == "answer":
        return list(answer)
    return [*range(job.solution_start - 1, job.solution_start - 1 + job.solution_len), *answer]


Norms = tuple[list[float], list[float]]


def gradient_norms(
    model: torch.nn.Module,
    items: Sequence[AttrInput],
    strings: ExitStrings,
    max_batch_tokens: int,
    progress: bool = False,
    objectives: Sequence[str] = ("answer",),
) -> dict[str, list[Norms]]:
    """Per objective and trace: (sum, mean) over each thinking segment's tokens of ‖∂ objective / ∂x_t‖₂.

    The objective is read on F (module docstring): ``answer`` = log p(y_ref | u_ref, F), ``value`` =
    log p(u_ref | F) + log p(y_ref | u_ref, F). One forward pass per chunk of traces and one backward
    pass per objective: rows of a padded batch do not interact, so the gradient of the summed objective
    with respect to row b's embeddings is row b's own gradient. Only the positions that predict target
    tokens go through the LM head (``logits_to_keep``), which keeps the logits small for large
    vocabularies. Weight gradients are never formed (``autograd.grad`` with respect to the inputs).
    """
    unknown = set(objectives) - set(OBJECTIVES)
    if unknown:
        raise ValueError(f"unknown objective(s) {sorted(unknown)}; expected {OBJECTIVES}")
    device = model_device(model)
    embed = model.get_input_embeddings()
    jobs = [_full_job(item, strings) for item in items]
    token_norms: dict[str, list[Tensor]] = {o: [torch.zeros(0)] * len(items) for o in objectives}
    for chunk in tqdm(
        chunk_jobs(jobs, max_batch_tokens), desc="gradient norms", unit="batch", disable=not progress
    ):
        chunk = [i for i in chunk if items[i].n_segments and jobs[i].answer_len]
        if not chunk:
            continue
        rows = [jobs[i] for i in chunk]
        width = max(len(job.ids) for job in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for b, job in enumerate(rows):
            ids[b, : len(job.ids)] = torch.tensor(job.ids)
            mask[b, : len(job.ids)] = 1
        ids, mask = ids.to(device), mask.to(device)
        keep = sorted({p for job in rows for o in objectives for p in _target_positions(job, o)})
        column = {p: j for j, p in enumerate(keep)}
        with torch.enable_grad():
            x = embed(ids).detach().requires_grad_(True)
            logits = model(
                inputs_embeds=x,
                attention_mask=mask,
                use_cache=False,
                logits_to_keep=torch.tensor(keep, device=device),
            ).logits
            log_p = torch.log_softmax(logits.float(), dim=-1)
            for n, objective in enumerate(objectives):
                total = x.new_zeros((), dtype=torch.float32)
                for b, job in enumerate(rows):
                    positions = _target_positions(job, objective)
                    cols = torch.tensor([column[p] for p in positions], device=device, dtype=torch.long)
                    targets = ids[b, torch.tensor(positions, device=device, dtype=torch.long) + 1]
                    total = total + log_p[b, cols].gather(-1, targets[:, None]).sum()
                (grad,) = torch.autograd.grad(total, x, retain_graph=n + 1 < len(objectives))
                norms = grad.float().norm(dim=-1).cpu()
                for b, i in enumerate(chunk):
                    p = len(items[i].prompt_ids)
                    token_norms[objective][i] = norms[b, p : p + items[i].cuts[-1]]
    return {
        o: [_segment_norms(item, n) for item, n in zip(items, token_norms[o], strict=True)]
        for o in objectives
    }


def _segment_norms(item: AttrInput, norms: Tensor) -> Norms:
    """Sum and mean of the per-token gradient norms over each thinking segment."""
    sums, means = [], []
    for k in range(item.n_segments):
        seg = norms[item.cuts[k] : item.cuts[k + 1]].double() if norms.numel() else torch.zeros(0)
        sums.append(float(seg.sum()) if seg.numel() else math.nan)
        means.append(float(seg.mean()) if seg.numel() else math.nan)
    return sums, means


def mc_values(rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[int, tuple[float | None, int]]]:
    """trace_id -> exit_index -> (mc_value, number of rollouts) from the Monte Carlo file."""
    values: dict[str, dict[int, tuple[float | None, int]]] = defaultdict(dict)
    for row in rows:
        value = row.get("mc_value")
        n = len(row.get("rollouts") or [])
        values[str(row["trace_id"])][int(row["exit_index"])] = (None if value is None else float(value), n)
    return dict(values)


def differences(values: Sequence[float | None]) -> list[float | None]:
    """values[k+1] − values[k], None where either side is missing or not finite."""

    out: list[float | None] = []
    for a, b in zip(values[:-1], values[1:], strict=True):
        finite = a is not None and b is not None and math.isfinite(a) and math.isfinite(b)
        out.append(b - a if finite else None)
    return out


def _finite(v: float | None) -> float | None:
    return float(v) if v is not None and math.isfinite(float(v)) else None


def segment_rows(
    trace: Mapping[str, Any],
    loo: tuple[list[float], list[float]],
    grad: Mapping[str, Norms],
    mc: Mapping[int, tuple[float | None, int]] | None,
) -> list[dict[str, Any]]:
    """Output lines of one trace: its thinking segments with their four credits and positions.

    ``from_right`` = (e − start_k) / e: the share of the thinking tokens from the segment's start to the
    model's exit. The segment lies within the last fraction f of the thinking part iff from_right ≤ f.
    """
    cuts = [int(c) for c in trace["cuts"]]
    n_seg = max(len(cuts) - 1, 0)
    e = cuts[-1] if cuts else 0
    rewards = list(trace.get("segment_rewards") or [])
    mc = mc or {}
    mc_credit = differences([mc.get(j, (None, 0))[0] for j in range(n_seg + 1)])
    rows = []
    for k in range(n_seg):
        rows.append(
            {
                **segment_fields(trace, k, n_seg, cuts, e),
                "start": cuts[k],
                "end": cuts[k + 1],
                "thinking_tokens": e,
                "rredcot": _finite(rewards[k]) if k < len(rewards) else None,
                "loo": _finite(loo[0][k]),
                "loo_value": _finite(loo[1][k]),
                "grad_norm": _finite(grad["answer"][0][k]),
                "grad_norm_mean": _finite(grad["answer"][1][k]),
                "grad_norm_value": _finite(grad["value"][0][k]) if "value" in grad else None,
                "grad_norm_value_mean": _finite(grad["value"][1][k]) if "value" in grad else None,
                "mc": mc_credit[k],
                "mc_samples": mc.get(k + 1, (None, 0))[1],
            }
        )
    return rows


def segment_fields(
    trace: Mapping[str, Any], k: int, n_segments: int, cuts: Sequence[int], e: int
) -> dict[str, Any]:
    """What identifies thinking segment k of a trace in every per-segment study output.

    ``from_right`` = (e - start) / e: the segment lies in the last fraction f of the thinking part
    when ``from_right <= f`` (Figure 4's x axis).
    """
    return {
        "trace_id": str(trace["trace_id"]),
        "problem_id": str(trace.get("problem_id", "")),
        "level": trace.get("level"),
        "correct": bool(trace.get("correct")),
        "seed": trace.get("seed"),
        "segment": k,
        "n_segments": n_segments,
        "from_right": (e - cuts[k]) / e if e else 1.0,
    }


def attr_inputs(traces: Sequence[Mapping[str, Any]], encode: Any) -> list[AttrInput]:
    """Token-id inputs of the trace rows; ``encode`` maps a text to ids (no special tokens)."""
    return [
        AttrInput(
            list(t["prompt_ids"]),
            list(t["completion_ids"]),
            [int(c) for c in t["cuts"]],
            encode(t.get("reference") or ""),
            encode(str(t["answer"])),
        )
        for t in traces
    ]


def attribute(
    model: torch.nn.Module,
    tokenizer: Any,
    traces: Sequence[Mapping[str, Any]],
    mc_rows: Iterable[Mapping[str, Any]],
    prompt_cfg: Mapping[str, Any],
    max_batch_tokens: int,
    progress: bool = True,
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Per-segment credit rows of every trace and the seconds each method took."""

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []

    strings = ExitStrings(
        encode(prompt_cfg["exit_string"]),
        encode(prompt_cfg["answer_prefix"]),
        encode(prompt_cfg["answer_suffix"]),
    )
    items = attr_inputs(traces, encode)
    t0 = time.time()
    with torch.inference_mode():
        loo = leave_one_out(model, items, strings, max_batch_tokens, progress)
    t1 = time.time()
    grad = gradient_norms(model, items, strings, max_batch_tokens, progress, OBJECTIVES)
    t2 = time.time()
    mc = mc_values(mc_rows)
    rows = [
        row
        for i, (t, lo) in enumerate(zip(traces, loo, strict=True))
        for row in segment_rows(t, lo, {o: g[i] for o, g in grad.items()}, mc.get(str(t["trace_id"])))
    ]
    return rows, {"loo_seconds": t1 - t0, "grad_seconds": t2 - t1}


def main(argv: Sequence[str] | None = None) -> None:
    from rredcot.infra.io import read_jsonl, write_jsonl
    from rredcot.infra.tracking import stage_run
    from rredcot.lm.modeling import load_model, load_tokenizer, set_threads
    from rredcot.settings.reads import stage_config

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", nargs="+", required=True, help="config YAML file(s), later ones override")
    ap.add_argument("--model", required=True, help="the model that scored the traces (value model)")
    ap.add_argument("--traces", required=True, help="traces with exit points and segment rewards (JSONL)")
    ap.add_argument("--mc", required=True, help="Monte Carlo values per (trace, exit point) (JSONL)")
    ap.add_argument("--out", required=True, help="per-segment credits (JSONL)")
    ap.add_argument("--figures", help="also draw Figure 4 into this directory")
    ap.add_argument("--limit", type=int, help="only the first N traces")
    args = ap.parse_args(argv)

    cfg = stage_config(args.config, "study_attribution")
    set_threads(cfg["threads"]["eval"])
    traces = read_jsonl(args.traces)[: args.limit]
    params = {"model": args.model, "traces": args.traces, "mc": args.mc, "n_traces": len(traces)}
    with stage_run(cfg, "study-attribution", rule="study_attribution", params=params) as run:
        t0 = time.time()
        tok = load_tokenizer(args.model)
        model = load_model(args.model, cfg["model"]["dtype"]).eval()
        if torch.cuda.is_available():
            model = model.cuda()
        budget = cfg["credit"]["budget"]["max_batch_tokens"]
        rows, timing = attribute(model, tok, traces, read_jsonl(args.mc), cfg["prompt"], budget)
        write_jsonl(args.out, rows)
        run.log_metrics({**timing, "segments": len(rows), "seconds": time.time() - t0})
        run.log_artifact(args.out)
        _log.info(f"{len(traces)} traces, {len(rows)} segments -> {args.out} ({timing})")
        if args.figures:
            from rredcot.studies.figures_attr import METHODS, VALUE_METHODS, VALUE_STEM, attribution_figure

            paths = attribution_figure(rows, Path(args.figures), METHODS)
            paths += attribution_figure(rows, Path(args.figures), VALUE_METHODS, VALUE_STEM)
            for path in paths:
                run.log_artifact(path)
            _log.info(f"Figure 4 (answer and value objectives) -> {args.figures}")


if __name__ == "__main__":
    setup_logging()
    main()
