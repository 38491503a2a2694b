"""Credit fidelity (synthetic task only): every registered credit method's credit against the exact
values, and what it cost.

    rredcot study-fidelity --config C --model DIR --traces traces.jsonl --data test.jsonl \\
        --json fidelity.json --csv fidelity_cost.csv --figure fidelity_cost.png

The synthetic task knows, at every exit point, the probability that a trace ends right (the ``exact``
method's values, ``rredcot.data.synthetic.exact_values``). That is the judge. On one shared set of
traces (the first ``studies.fidelity.traces`` of the ``analysis`` set of ``study-traces``, sampled
from the model RL starts from), every method of the registry (``rredcot.credit_methods()``) assigns
credit through ``CreditAssigner.assign``, as the trainer calls it, and is given what its reward
source needs: reference pairs, where a wrong trace goes wrong (``culprit``), the exact values
(``task_values``), the trace's own outcome, and policy rollouts (``PolicyRollouts``, the trainer's
own); a method that reads an implicit process reward model (PRIME) gets one trained online over the
traces, each trace scored in a group of its prompt's completions (``rredcot.studies.fidelity_prime``).
A method that needs something else is skipped, and the reason is logged and written out.
Methods whose source reads ``credit.mc`` are scored once per Monte Carlo budget M of
``studies.fidelity.mc_samples``: each budget is a point of its own, with rollouts of its own.

**Segments.** Credit is compared on the segments of the exact method's own assignment: RREDCoT's
exit-point segments (``assigner.segment``: the thinking segments, then the answer segment after the
model's own exit). For each segment:

- the credit a method pays is the sum over the segment's tokens of the advantage it applies to each
  token (``rredcot.method.assign.paid_credit``: ``A·σ_t·|o|`` for methods that spread the trace's
  advantage ``A``, or the token's own advantage for methods that give one, such as SPO-chain). A
  method with segments of its own, or with token-level credit, is thus read on these segments by
  summing its token credit over them;
- the truth is the exact value change across it: ``v(cut_{k+1}) - v(cut_k)`` for a thinking segment,
  the trace's outcome minus the value at the exit for the answer segment.

**Metrics**, per method (and budget):

- ``rho_trace``: Spearman's ρ of paid credit against the truth within each trace with at least 3
  segments, averaged over those traces (a constant side, e.g. uniform credit on segments of equal
  length, counts as ρ = 0: it ranks nothing);
- ``rho_pooled``: Spearman's ρ over every segment of every trace;
- ``culprit_hit``: over wrong traces whose first wrong step the task locates
  (``rredcot.data.synthetic.culprit``), how often the most-blamed segment (the lowest paid credit)
  is the one that holds it (a tie of k segments counts 1/k when the culprit is among them);
- ``sign_agreement``: over the segments of right traces, how often the method pays more than an even
  share (the trace's total paid credit spread by length) exactly where the value rises faster than
  its even share (the total value change spread by length), among segments where the latter is not
  zero. Methods that only redistribute a positive advantage never pay a negative credit, so it is
  read relative to the even share; uniform credit scores 0;
- cost: wall seconds of the method's ``assign`` calls (every pass it runs: entropies, scoring,
  greedy answer baseline, rollouts) per trace and per completion token scored, on this machine.

Intervals: 95% percentile intervals from a bootstrap over problems (whole problems, with all their
traces and segments, drawn with replacement; ``BOOTSTRAP_DRAWS`` resamples seeded by
``studies.seed``), as the claims' correlations have; every method is read on the same draws, so a
difference of two is paired. The claim "RREDCoT's credit is closer to the exact values than Monte
Carlo's at equal cost" compares RREDCoT's pooled ρ with the Monte Carlo budget whose seconds per
trace are nearest RREDCoT's on a log scale (the nearest budget, not an interpolation: every number
compared is one that was measured).

Outputs: ``--json`` (the table's rows, the comparison, skipped methods, and every trace's segments
with each method's paid credit), ``--csv`` (one row per method and budget) and ``--figure`` (PNG and
PDF: fidelity against cost). Every setting comes from the config (``rredcot.settings.reads``, stage
``study_fidelity``).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy import stats
from tqdm.auto import tqdm

from rredcot.data.records import row_reward
from rredcot.data.synthetic import culprit_offset, exact_value_functions
from rredcot.infra.io import read_jsonl, write_json
from rredcot.infra.logs import setup_logging
from rredcot.infra.stats import MIN_CLUSTERS, ClusterBootstrap, Interval
from rredcot.lm.evaluation import load_benchmarks
from rredcot.lm.generation import HFGenerator, VLLMGenerator, VLLMOptions, device_name, load_vllm
from rredcot.lm.modeling import load_model, load_tokenizer, set_threads
from rredcot.lm.rollouts import PolicyRollouts
from rredcot.method import segmentation as S
from rredcot.method.assign import CreditAssigner, TraceCredit, paid_credit
from rredcot.method.registry import CREDIT_METHODS, NEEDS, TraceInput
from rredcot.method.settings import CreditConfig
from rredcot.settings.config import credit_config
from rredcot.settings.reads import stage_config
from rredcot.studies.fidelity_prime import companions, online_prime
from rredcot.studies.figures_attr import BOOTSTRAP_DRAWS

_log = logging.getLogger(__name__)

JUDGE = "exact"
"""The method whose values are the truth."""
SUPPLIED = frozenset(NEEDS)
"""What the study gives a reward source: every need the registry knows (reference pairs, culprit,
outcome, rollouts, task values, and ``process_log_probs``, an implicit reward model trained online
over the traces as a run trains it: ``rredcot.studies.fidelity_prime``)."""
MIN_SEGMENTS = 3
"""A trace's own rank correlation needs at least this many segments."""


# ----------------------------------------------------------------------------------------- credit
def segment_sums(values: Sequence[float] | torch.Tensor, bounds: Sequence[int]) -> list[float]:
    """Sums of ``values`` over the token ranges ``[bounds[k], bounds[k+1])``."""
    x = torch.as_tensor(values, dtype=torch.float64)
    return [float(x[a:b].sum()) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def exact_segments(
    credit: TraceCredit, n_tokens: int, answered: bool, outcome: float
) -> tuple[list[int], list[float]] | None:
    """The judge's segments of one trace: token bounds (K+1) and the exact value change across each
    (the thinking segments between consecutive exit points, then the answer segment: the outcome
    minus the value at the exit). None when its segments and values do not line up (a trace that
    exits before any token)."""
    values = torch.exp(credit.log_values.double()).tolist()
    truth = [b - a for a, b in zip(values[:-1], values[1:], strict=True)]
    if answered:
        truth.append(outcome - values[-1])
    starts = list(credit.segment_starts)
    if not truth or len(starts) != len(truth) or starts[0] != 0 or starts != sorted(set(starts)):
        return None
    return [*starts, n_tokens], truth


def culprit_segment(texts: Sequence[str], offset: int | None, bounds: Sequence[int]) -> int | None:
    """The segment holding character ``offset`` of the completion (None: the trace is right)."""
    if offset is None:
        return None
    token = S.token_at(list(texts), offset)
    if token is None:
        return None
    return max(k for k, s in enumerate(bounds[:-1]) if s <= token)


@dataclass(frozen=True)
class Point:
    """One scored method: a registered credit method, at one Monte Carlo budget where it has one."""

    key: str
    method: str
    samples: int | None
    config: CreditConfig


def method_arm(cfg: Mapping[str, Any], method: str) -> str:
    """The arm whose credit options a method is scored with: the first arm that trains with it, else
    the first RREDCoT arm, else the first arm."""
    arms = cfg["arms"]
    found = next((a for a, spec in arms.items() if spec["credit"] == method), None)
    return found or next((a for a, spec in arms.items() if spec["credit"] == "rredcot"), next(iter(arms)))


def reads_budget(method: str) -> bool:
    """Whether the method's reward source reads the Monte Carlo settings (``credit.mc``)."""
    return "mc" in CREDIT_METHODS[method].reward_source.reads


def method_points(
    cfg: Mapping[str, Any], methods: Sequence[str], budgets: Sequence[int]
) -> tuple[list[Point], dict[str, str]]:
    """The points to score (one per method, one per budget M for a method that reads ``credit.mc``)
    and the methods skipped, with the reason."""
    points, skipped = [], {}
    for name in methods:
        missing = sorted(set(CREDIT_METHODS[name].needs) - SUPPLIED)
        if missing:
            skipped[name] = f"needs {', '.join(missing)}, which the study cannot supply"
            continue
        config = credit_config(cfg, method_arm(cfg, name), name)
        if reads_budget(name):
            for m in budgets:
                mc = dataclasses.replace(config.mc, samples=int(m))
                points.append(Point(f"{name}@{m}", name, int(m), dataclasses.replace(config, mc=mc)))
        else:
            points.append(Point(name, name, None, config))
    return points, skipped


# ---------------------------------------------------------------------------------------- metrics
def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's ρ; 0 when either side is constant (it ranks nothing), NaN below two pairs."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(x) < 2:
        return math.nan
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return 0.0
    return float(stats.spearmanr(x, y).statistic)


def _sign(x: np.ndarray, scale: float) -> np.ndarray:
    return np.where(np.abs(x) <= 1e-9 * max(scale, 1.0), 0, np.sign(x))


def trace_metrics(
    paid: Sequence[float], truth: Sequence[float], lengths: Sequence[int], correct: bool, culprit: int | None
) -> dict[str, float]:
    """One trace's numbers for one method (NaN where a metric does not apply to the trace)."""
    p, t = np.asarray(paid, dtype=float), np.asarray(truth, dtype=float)
    n = np.asarray(lengths, dtype=float)
    out = {
        "rho": spearman(p, t) if len(p) >= MIN_SEGMENTS else math.nan,
        "hit": math.nan,
        "agree": 0.0,
        "signed": 0.0,
    }
    if not correct and culprit is not None:
        lowest = np.flatnonzero(p <= p.min() + 1e-12 * max(1.0, float(np.abs(p).max())))
        out["hit"] = 1.0 / len(lowest) if culprit in lowest else 0.0
    if correct and n.sum() > 0:
        excess = _sign(p - n * p.sum() / n.sum(), float(np.abs(p).sum()))
        rises = _sign(t - n * t.sum() / n.sum(), float(np.abs(t).sum()))
        out["signed"] = float((rises != 0).sum())
        out["agree"] = float(((rises != 0) & (excess == rises)).sum())
    return out


def _interval(draws: np.ndarray, estimate: float, enough: bool) -> Interval:
    finite = draws[np.isfinite(draws)]
    if not enough or not math.isfinite(estimate) or len(finite) < len(draws) / 2:
        return Interval(estimate, math.nan, math.nan)
    low, high = np.percentile(finite, [2.5, 97.5], method="inverted_cdf")
    return Interval(estimate, float(low), float(high))


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


class Bootstrap:
    """The traces' numbers for every method, on the same draws of whole problems for all of them
    (``rredcot.infra.stats.ClusterBootstrap``)."""

    def __init__(self, traces: Sequence[Mapping[str, Any]], draws: int, seed: int) -> None:
        boot = ClusterBootstrap([t["problem_id"] for t in traces], draws, seed)
        self.traces, self.problems, self.draws = list(traces), boot.names, boot.draws
        self.enough = boot.enough
        self.weights = boot.weights  # [draws, traces]
        self.truth = np.concatenate([np.asarray(t["truth"], dtype=float) for t in traces])
        # Each segment's problem: its trace's, once per segment.
        segments = np.repeat(boot.codes, [len(t["truth"]) for t in traces])
        self._rows = boot.rows(segments)
        self._truth_ranks = [stats.rankdata(self.truth[rows]) for rows in self._rows]

    def pooled(self, paid: np.ndarray) -> tuple[float, np.ndarray]:
        """Pooled ρ of a method's segment credit (in segment order) and its value on every draw."""
        out = np.full(len(self.draws), math.nan)
        for b in range(len(self.draws)):
            x, truth = paid[self._rows[b]], self._truth_ranks[b]
            if np.ptp(x) > 0 and np.ptp(truth) > 0:  # a constant side has no rank correlation
                out[b] = np.corrcoef(stats.rankdata(x), truth)[0, 1]
        return spearman(paid, self.truth), out

    def mean(self, values: np.ndarray, counts: np.ndarray | None = None) -> tuple[float, np.ndarray]:
        """Σ values / Σ counts over the traces (counts: 1 where the value is finite), on the data and
        on every draw."""
        ok = np.isfinite(values)
        v = np.where(ok, values, 0.0)
        c = ok.astype(float) if counts is None else np.where(ok, counts, 0.0)
        estimate = float(v.sum() / c.sum()) if c.sum() > 0 else math.nan
        return estimate, _ratio(self.weights @ v, self.weights @ c)


def score(
    traces: Sequence[Mapping[str, Any]],
    keys: Sequence[str],
    draws: int = BOOTSTRAP_DRAWS,
    seed: int = 0,
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, np.ndarray]]]:
    """Per point key: its fidelity numbers with 95% intervals; and every draw of the pooled and the
    per-trace ρ (for paired differences).

    ``traces``: ``problem_id``, ``correct``, ``lengths`` (tokens per segment), ``truth`` (exact value
    change per segment), ``culprit`` (segment index or None) and ``paid`` (key -> credit per segment).
    """
    if not traces:
        raise ValueError("no traces to score")
    boot = Bootstrap(traces, draws, seed)
    rows, kept = {}, {}
    for key in keys:
        per = [
            trace_metrics(t["paid"][key], t["truth"], t["lengths"], bool(t["correct"]), t.get("culprit"))
            for t in traces
        ]
        column = {m: np.array([p[m] for p in per], dtype=float) for m in per[0]} if per else {}
        paid = np.concatenate([np.asarray(t["paid"][key], dtype=float) for t in traces])
        pooled, pooled_draws = boot.pooled(paid)
        rho, rho_draws = boot.mean(column["rho"])
        hit, hit_draws = boot.mean(column["hit"])
        agree, agree_draws = boot.mean(column["agree"], column["signed"])
        row: dict[str, Any] = {
            "traces": len(traces),
            "problems": len(boot.problems),
            "segments": len(paid),
            "traces_ranked": int(np.isfinite(column["rho"]).sum()),
            "wrong_located": int(np.isfinite(column["hit"]).sum()),
            "right_segments": int(column["signed"].sum()),
        }
        for name, value, d in (
            ("rho_pooled", pooled, pooled_draws),
            ("rho_trace", rho, rho_draws),
            ("culprit_hit", hit, hit_draws),
            ("sign_agreement", agree, agree_draws),
        ):
            iv = _interval(d, value, boot.enough)
            row |= {name: iv.estimate, f"{name}_low": iv.low, f"{name}_high": iv.high}
        rows[key] = row
        kept[key] = {"rho_pooled": pooled_draws, "rho_trace": rho_draws}
    return rows, kept


def chance_hit(traces: Sequence[Mapping[str, Any]]) -> float:
    """The culprit hit rate of a blind guess: one over the segments, over the located wrong traces."""
    located = [t for t in traces if not t["correct"] and t.get("culprit") is not None]
    return float(np.mean([1.0 / len(t["truth"]) for t in located])) if located else math.nan


def nearest_budget(seconds: Mapping[str, float], method: str, reference: str) -> str | None:
    """The key of ``reference``'s budget whose seconds per trace are nearest ``method``'s (log scale)."""
    own = seconds.get(method)
    budgets = {k: s for k, s in seconds.items() if k.startswith(f"{reference}@") and s > 0}
    if own is None or own <= 0 or not budgets:
        return None
    return min(budgets, key=lambda k: (abs(math.log(budgets[k] / own)), budgets[k]))


def compare(
    rows: Mapping[str, Mapping[str, Any]],
    draws: Mapping[str, Mapping[str, np.ndarray]],
    method: str = "rredcot",
    reference: str = "mc",
    enough: bool = True,
) -> dict[str, Any] | None:
    """``method``'s ρ minus the ``reference`` budget nearest its cost, pooled and per trace, with paired
    bootstrap intervals; None without both."""
    seconds = {k: float(r["seconds_per_trace"]) for k, r in rows.items()}
    at = nearest_budget(seconds, method, reference)
    if at is None or method not in draws:
        return None
    out: dict[str, Any] = {
        "method": method,
        "reference": at,
        "samples": rows[at].get("samples"),
        "seconds_per_trace": seconds[method],
        "reference_seconds_per_trace": seconds[at],
        "cost_ratio": seconds[at] / seconds[method],
    }
    for measure in ("rho_pooled", "rho_trace"):
        a, b = float(rows[method][measure]), float(rows[at][measure])
        iv = _interval(draws[method][measure] - draws[at][measure], a - b, enough)
        out |= {
            measure: a,
            f"reference_{measure}": b,
            f"{measure}_diff": iv.estimate,
            f"{measure}_diff_low": iv.low,
            f"{measure}_diff_high": iv.high,
        }
    return out


# -------------------------------------------------------------------------------------- scoring
def trace_inputs(
    traces: Sequence[Mapping[str, Any]],
    rows: Sequence[Mapping[str, Any]],
    assigner: CreditAssigner,
    tokenizer: Any,
) -> list[TraceInput]:
    """Every trace as the trainer would hand it to ``assign``, with every need supplied: its reference
    pair, culprit, outcome, and exact values at the set's own slip rate."""
    texts = [assigner.completion_text(list(t["completion_ids"])) for t in traces]
    values = exact_value_functions(rows, texts)
    items = []
    for t, row, text, value in zip(traces, rows, texts, values, strict=True):
        decoded = tokenizer.decode(list(t["completion_ids"]), skip_special_tokens=True)
        items.append(
            TraceInput(
                list(t["prompt_ids"]),
                list(t["completion_ids"]),
                float(t["advantage"]),
                [(str(t.get("reference") or ""), str(t["answer"]))],
                culprit=culprit_offset(row, text),
                outcome=row_reward(row, decoded),
                task_values=value,
            )
        )
    return items


def run_point(
    point: Point,
    model: torch.nn.Module,
    tokenizer: Any,
    items: Sequence[TraceInput],
    rows: Sequence[Mapping[str, Any]],
    batch: int,
    rollout_args: Mapping[str, Any],
    progress: Any = None,
    engine: Any = None,
) -> tuple[list[TraceCredit], dict[str, float]]:
    """A point's credit for every trace, and its cost: wall seconds of its ``assign`` calls (and of
    each pass), and the rollouts and tokens it generated. ``engine``: a vLLM engine on the same
    model (``studies.backend: vllm``), which then samples the rollouts instead of transformers."""
    assigner = CreditAssigner(tokenizer, point.config)
    needs = point.config.kind.needs
    credits: list[TraceCredit] = []
    cost = {"seconds": 0.0, "rollouts": 0.0, "rollout_tokens": 0.0}
    for start in range(0, len(items), batch):
        part = list(items[start : start + batch])
        rollouts = None
        if "rollouts" in needs:
            part_rows = rows[start : start + batch]
            settings = point.config.rollout_settings  # the method's own: mc, or SPO-chain's
            rollouts = PolicyRollouts(
                tokenizer,
                lambda j, text, part_rows=part_rows: row_reward(part_rows[j], text),
                [str(r["id"]) for r in part_rows],
                samples=settings.samples,
                batch_size=settings.batch_size,
                max_new_tokens=settings.max_new_tokens or rollout_args["max_new_tokens"],
                temperature=rollout_args["temperature"],
                top_p=rollout_args["top_p"],
                seed=(rollout_args["seed"], point.method, settings.samples, start),
                engine=engine,
            )
        t0 = time.perf_counter()
        with torch.inference_mode():
            credits += assigner.assign(model, part, rollouts=rollouts)
        cost["seconds"] += time.perf_counter() - t0
        for name, s in assigner.seconds.items():
            cost[f"{name}_seconds"] = cost.get(f"{name}_seconds", 0.0) + s
        if rollouts is not None:
            cost["rollouts"] += rollouts.rollouts
            cost["rollout_tokens"] += rollouts.tokens
        if progress is not None:
            progress.update(len(part))
    return credits, cost


def prime_groups(
    cfg: Mapping[str, Any],
    model: torch.nn.Module,
    tokenizer: Any,
    items: Sequence[TraceInput],
    traces: Sequence[Mapping[str, Any]],
    rows: Sequence[Mapping[str, Any]],
    seed: int,
    batch: int,
    engine: Any = None,
) -> list[list[TraceInput]]:
    """Every trace in a group of ``rl.num_generations`` completions of its prompt (the rest sampled
    with the study's settings, graded like the trace, by ``engine`` when there is one): the groups
    PRIME's baselines read."""
    studies = cfg["studies"]
    sampling = {k: studies[k] for k in ("temperature", "top_p", "max_new_tokens")}
    return companions(
        items,
        [str(t["trace_id"]) for t in traces],
        lambda j, text: row_reward(rows[j], text),
        VLLMGenerator(None, tokenizer, llm=engine)
        if engine is not None
        else HFGenerator(model, tokenizer, batch_size=max(batch, 1) * 4),
        int(cfg["rl"]["num_generations"]),
        seed,
        sampling,
    )


def trace_records(
    traces: Sequence[Mapping[str, Any]],
    items: Sequence[TraceInput],
    texts: Sequence[Sequence[str]],
    judge: Sequence[TraceCredit],
    ends: Sequence[int | None],
) -> list[dict[str, Any] | None]:
    """Per trace, the judge's segments (bounds, lengths, truth) and the culprit's segment; None for a
    trace whose segments do not line up."""
    out: list[dict[str, Any] | None] = []
    for t, item, tx, credit, end in zip(traces, items, texts, judge, ends, strict=True):
        n = len(item.completion_ids)
        answered = end is not None and end < n
        found = exact_segments(credit, n, answered, float(item.outcome or 0.0))
        if found is None:
            out.append(None)
            continue
        bounds, truth = found
        out.append(
            {
                "trace_id": str(t["trace_id"]),
                "problem_id": str(t["problem_id"]),
                "level": t.get("level"),
                "correct": bool(t["correct"]),
                "advantage": item.advantage,
                "bounds": bounds,
                "lengths": [b - a for a, b in zip(bounds[:-1], bounds[1:], strict=True)],
                "truth": truth,
                "culprit": culprit_segment(tx, item.culprit, bounds),
                "paid": {},
            }
        )
    return out


def fidelity_rows(
    points: Sequence[Point],
    records: Sequence[Mapping[str, Any]],
    costs: Mapping[str, Mapping[str, float]],
    tokens: int,
    draws: int,
    seed: int,
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The table (one row per point, in registry order) and RREDCoT's comparison with Monte Carlo."""
    scored, kept = score(records, [p.key for p in points], draws, seed)
    n = max(len(records), 1)
    rows = []
    for p in points:
        cost = costs[p.key]
        rows.append(
            {"key": p.key, "method": p.method, "samples": p.samples}
            | scored[p.key]
            | {
                "seconds": cost["seconds"],
                "seconds_per_trace": cost["seconds"] / n,
                "seconds_per_token": cost["seconds"] / max(tokens, 1),
                "rollouts_per_trace": cost["rollouts"] / n,
            }
        )
    by_key = {r["key"]: r for r in rows}
    enough = len({str(t["problem_id"]) for t in records}) >= MIN_CLUSTERS
    return rows, compare(by_key, kept, enough=enough)


def main(argv: Sequence[str] | None = None) -> None:
    from rredcot import credit_methods
    from rredcot.infra.tracking import stage_run
    from rredcot.studies.figures_fidelity import plot_fidelity, write_table

    ap = argparse.ArgumentParser(
        prog="rredcot study-fidelity",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--config", nargs="+", required=True, help="config YAML file(s): every setting")
    ap.add_argument("--model", required=True, help="model directory (the policy that wrote the traces)")
    ap.add_argument("--traces", required=True, help="study traces (rredcot study-traces, analysis set)")
    ap.add_argument("--data", nargs="+", required=True, help="the problem file(s) the traces were drawn from")
    ap.add_argument("--json", required=True, type=Path, help="everything measured (JSON)")
    ap.add_argument("--csv", required=True, type=Path, help="the table: one row per method and budget")
    ap.add_argument("--figure", required=True, type=Path, help="fidelity against cost (PNG; a PDF beside it)")
    ap.add_argument("--batch-size", type=int, default=16, help="traces per credit-assignment call")
    args = ap.parse_args(argv)

    cfg = stage_config(args.config, "study_fidelity")
    set_threads(cfg["threads"]["eval"])
    studies = cfg["studies"]
    settings = studies["fidelity"]
    seed = int(studies["seed"])
    traces = read_jsonl(args.traces)
    if settings["traces"] is not None:
        traces = traces[: int(settings["traces"])]
    problems = {str(r["id"]): r for r in load_benchmarks(args.data, None)}
    missing = sorted({str(t["problem_id"]) for t in traces} - set(problems))
    if missing:
        raise SystemExit(f"study-fidelity: problems {missing[:5]} of the traces are not in {args.data}")
    rows = [problems[str(t["problem_id"])] for t in traces]
    points, skipped = method_points(cfg, credit_methods(), settings["mc_samples"])
    if JUDGE not in {p.key for p in points}:
        raise SystemExit(f"study-fidelity: the judge, credit method {JUDGE!r}, is not registered")
    for name, reason in skipped.items():
        _log.warning(f"skipped credit method {name}: {reason}")
    rollout_args = {
        "max_new_tokens": int(studies["max_new_tokens"]),
        "temperature": float(studies["temperature"]),
        "top_p": float(studies["top_p"]),
        "seed": seed,
    }
    params = {k: str(v) for k, v in vars(args).items() if k != "config"}
    params |= {"traces_scored": len(traces), "points": ",".join(p.key for p in points)}
    with stage_run(cfg, f"study-fidelity-s{seed}", rule="study_fidelity", seed=seed, params=params) as run:
        t0 = time.time()
        device = "cuda" if torch.cuda.is_available() else "cpu"
        tok, model = (
            load_tokenizer(args.model),
            load_model(args.model, cfg["model"]["dtype"]).eval().to(device),
        )
        # Read whatever the backend, as study_mc does: the study declares them (settings.reads).
        options = VLLMOptions.from_config(cfg["eval"]["vllm"], cfg["vllm_cpu"], cfg["model"]["dtype"])
        engine = None
        if studies["backend"] == "vllm":  # the rollouts of Monte Carlo credit, SPO-chain and PRIME's groups
            engine = load_vllm(args.model, options, "study-fidelity rollouts", enable_prefix_caching=True)
        judge_points = [p for p in points if p.key == JUDGE]
        assigner = CreditAssigner(tok, judge_points[0].config)
        items = trace_inputs(traces, rows, assigner, tok)
        texts = [assigner.token_texts(item.completion_ids) for item in items]
        ends = [S.thinking_end(tx, assigner.cfg.exit_string) for tx in texts]
        tokens = sum(len(item.completion_ids) for item in items)
        with torch.inference_mode():  # a warm-up, so that no method pays for the first forward pass
            assigner.assign(model, items[:2])
        costs: dict[str, dict[str, float]] = {}
        credits: dict[str, list[TraceCredit]] = {}
        order = judge_points + [p for p in points if p.key != JUDGE]
        groups: list[list[TraceInput]] = []
        with tqdm(total=len(order) * len(items), desc="credit", unit="trace") as bar:
            for point in order:
                bar.set_postfix_str(point.key)
                if "process_log_probs" in point.config.kind.needs:
                    groups = groups or prime_groups(cfg, model, tok, items, traces, rows, seed, 16, engine)
                    credits[point.key], costs[point.key] = online_prime(
                        point.config,
                        model,
                        tok,
                        groups,
                        int(cfg["rl"]["prompts_per_step"]),
                        float(studies["temperature"]),
                        float(cfg["rl"]["learning_rate"]),
                        args.batch_size,
                        bar,
                    )
                else:
                    credits[point.key], costs[point.key] = run_point(
                        point, model, tok, items, rows, args.batch_size, rollout_args, bar, engine
                    )
                _log.info(f"{point.key}: {costs[point.key]['seconds']:.2f}s for {len(items)} traces")
        records = trace_records(traces, items, texts, credits[JUDGE], ends)
        dropped = [str(t["trace_id"]) for t, r in zip(traces, records, strict=True) if r is None]
        if dropped:
            _log.warning(f"{len(dropped)} traces whose segments do not line up are left out: {dropped[:5]}")
        kept = [(j, r) for j, r in enumerate(records) if r is not None]
        for j, record in kept:
            for point in points:
                paid = paid_credit(credits[point.key][j], items[j].advantage)
                record["paid"][point.key] = segment_sums(paid, record["bounds"])
        scored = [r for _, r in kept]
        table, comparison = fidelity_rows(points, scored, costs, tokens, BOOTSTRAP_DRAWS, seed)
        summary = {
            "judge": JUDGE,
            "model": args.model,
            "device": device_name(),
            "threads": int(cfg["threads"]["eval"]),
            "traces": len(scored),
            "dropped": dropped,
            "tokens": tokens,
            "bootstrap": BOOTSTRAP_DRAWS,
            "seed": seed,
            "mc_samples": list(settings["mc_samples"]),
            "chance_culprit_hit": chance_hit(scored),
            "skipped": skipped,
            "rows": table,
            "costs": costs,
            "comparison": comparison,
            "segments": scored,
        }
        write_json(args.json, summary)
        write_table(table, args.csv)
        figures = plot_fidelity(table, summary, args.figure)
        for path in (args.json, args.csv, *figures):
            run.log_artifact(path)
        run.log_metrics(
            {
                f"{r['key']}/{m}": float(r[m])
                for r in table
                for m in ("rho_pooled", "rho_trace", "seconds_per_trace")
            }
            | {"traces": len(scored), "wall_seconds": time.time() - t0}
        )
        run.set_tags({"rredcot.device": device_name()})
        for r in table:
            _log.info(
                f"{r['key']:>16}: ρ pooled {r['rho_pooled']:.3f} [{r['rho_pooled_low']:.3f}, "
                f"{r['rho_pooled_high']:.3f}], per trace {r['rho_trace']:.3f}, "
                f"culprit {r['culprit_hit']:.3f}, sign {r['sign_agreement']:.3f}; "
                f"{r['seconds_per_trace'] * 1e3:.2f} ms per trace"
            )
        if comparison is not None:
            c = comparison
            _log.info(
                f"rredcot - {c['reference']} (ρ within a trace, {c['cost_ratio']:.2f}x its cost): "
                f"{c['rho_trace_diff']:.3f} "
                f"[{c['rho_trace_diff_low']:.3f}, {c['rho_trace_diff_high']:.3f}]"
            )
        _log.info(f"wrote {args.json}, {args.csv}, {args.figure}")


if __name__ == "__main__":
    setup_logging()
    main()
