"""Does the blame land on the step where a wrong trace goes wrong? (synthetic task only)

On the synthetic task every step of a trace can be checked, so the place where a wrong trace goes
wrong is known. For each wrong trace of ``study-traces`` this finds the culprit (its first wrong
step):

- the thinking line that set the wrong value the final solution copied: the first wrong value of
  the final solution, when the thinking kept the same value for that step (a ``Wait,`` line revises
  the step before it, so a corrected slip is not a culprit), or
- the answer segment, when the final solution went wrong on its own: it copied a value wrongly, or
  computed a step wrongly (a thinking error that the solution did not copy did not matter);

and reads the segment credit the trace got: the culprit segment's share of the blame weights
(w_k = max(−r̂_k, 0) / Σ, docs/method.md, "From a trace to σ", for a negative advantage), whether it
got the largest weight, and chance (one over the number of segments). The same numbers for the σ
mass: the culprit segment's share of Σσ against its share of the tokens. For a culprit in the
thinking it also records where the largest blame among the thinking segments landed, relative to
the culprit: a value model that only notices a wrong value once the next line reuses it blames the
segment after (offset 1).

With ``--views DIR`` it also draws the credit pictures (``rredcot.viz.credit_view``) of the first few
wrong traces of each kind: ``DIR/thinking_<i>.png`` and ``DIR/answer_<i>.png`` (and ``.html``).

CLI: ``rredcot study-localisation --config C --traces traces.jsonl --out localisation.json
[--views DIR]``.
"""

from __future__ import annotations

import argparse
import logging
import re
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rredcot.data.synthetic import culprit
from rredcot.infra.logs import setup_logging

_log = logging.getLogger(__name__)

_PROBLEM = re.compile(r"Start at .*?Work mod \d+\s*\.")


def trace_localisation(row: dict[str, Any]) -> dict[str, Any] | None:
    """Where one wrong trace goes wrong and how much of its blame and σ that segment got."""
    if row.get("correct") or row.get("truncated"):
        return None
    match = _PROBLEM.search(str(row.get("prompt", "")))
    found = culprit(match.group(0), "".join(row["tokens"])) if match else None
    if found is None:
        return None
    kind, char = found
    tokens = row["tokens"]
    ends, total = [], 0
    for text in tokens:
        total += len(text)
        ends.append(total)
    token = next((j for j, e in enumerate(ends) if e > char), len(tokens) - 1)
    starts = row["segment_starts"]  # the answer segment, if any, is the last
    segment = max(k for k, s in enumerate(starts) if s <= token)
    rewards = row["segment_rewards"]
    if len(rewards) != len(starts):
        raise ValueError(f"trace {row.get('trace_id')}: {len(rewards)} rewards for {len(starts)} segments")
    blame = [max(-r, 0.0) for r in rewards]
    n_thinking = len(starts) - (row.get("answer_reward") is not None)
    offset = None
    if kind == "thinking" and any(blame[:n_thinking]):
        offset = max(range(n_thinking), key=blame.__getitem__) - segment
    bounds = [*starts, len(tokens)]
    sigma = row["sigma"]
    seg_sigma = sum(sigma[bounds[segment] : bounds[segment + 1]])
    return {
        "trace_id": row.get("trace_id"),
        "where": kind,
        "segment": segment,
        "segments": len(starts),
        "blame_share": blame[segment] / sum(blame) if sum(blame) > 0 else 1.0 / len(starts),
        "top_blame": bool(sum(blame) > 0 and blame[segment] == max(blame)),
        "sigma_share": seg_sigma,
        "token_share": (bounds[segment + 1] - bounds[segment]) / len(tokens),
        "thinking_top_offset": offset,
    }


def summarise(found: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean blame share, top-blame rate and chance, over all wrong traces and per culprit location."""

    def stats(rows: list[dict[str, Any]]) -> dict[str, Any]:
        if not rows:
            return {"traces": 0}
        return {
            "traces": len(rows),
            "top_blame_rate": statistics.mean(float(r["top_blame"]) for r in rows),
            "blame_share": statistics.mean(r["blame_share"] for r in rows),
            "chance": statistics.mean(1.0 / r["segments"] for r in rows),
            "sigma_share": statistics.mean(r["sigma_share"] for r in rows),
            "token_share": statistics.mean(r["token_share"] for r in rows),
        }

    thinking = [r for r in found if r["where"] == "thinking"]
    lag = {}
    if thinking:
        # Where the most-blamed thinking segment lies relative to the culprit (none: no thinking blame).
        offsets = [r.get("thinking_top_offset") for r in thinking]
        lag = {
            "thinking_top_at_culprit": statistics.mean(float(o == 0) for o in offsets),
            "thinking_top_one_later": statistics.mean(float(o == 1) for o in offsets),
        }
    return {
        "all": stats(found),
        "thinking": stats(thinking) | lag,
        "answer": stats([r for r in found if r["where"] == "answer"]),
        "traces": found,
    }


_VIEW_KEYS = (
    "trace_id",
    "method",
    "prompt",
    "answer",
    "advantage",
    "tokens",
    "sigma",
    "segment_starts",
    "cuts",
    "log_values",
    "thought_nll",
    "answer_nll",
    "entropies",
    "answer_reward",
    "answer_baseline",
)


def write_culprit_views(
    rows: list[dict[str, Any]], found: list[dict[str, Any]], out_dir: Path, per_kind: int
) -> list[Path]:
    """Credit pictures of the first ``per_kind`` wrong traces whose culprit is in the thinking and in
    the answer; the directory exists afterwards even when there is nothing to draw."""
    from rredcot.viz.credit_view import write_views

    out_dir.mkdir(parents=True, exist_ok=True)
    by_id = {row.get("trace_id"): row for row in rows}
    written: list[Path] = []
    for kind in ("thinking", "answer"):
        picked = [by_id[f["trace_id"]] for f in found if f["where"] == kind][:per_kind]
        records = [
            {key: row.get(key) for key in _VIEW_KEYS} | {"step": None, "reward": 0.0} for row in picked
        ]
        if records:
            written += write_views(records, out_dir, stem=kind)
    return written


def main(argv: Sequence[str] | None = None) -> None:
    from rredcot.infra.io import read_jsonl, write_json
    from rredcot.infra.tracking import stage_run
    from rredcot.settings.reads import stage_config

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", nargs="+", required=True, help="config YAML file(s), later ones override")
    ap.add_argument("--traces", required=True, help="traces with credit from study-traces (JSONL)")
    ap.add_argument("--out", required=True, type=Path, help="summary (JSON)")
    ap.add_argument("--views", type=Path, help="directory for credit pictures of a few wrong traces")
    ap.add_argument("--n-views", type=int, default=4, help="pictures per culprit kind (thinking, answer)")
    args = ap.parse_args(argv)
    cfg = stage_config(args.config, "study_localisation")
    with stage_run(
        cfg, "study-localisation", rule="study_localisation", params={"traces": args.traces}
    ) as run:
        rows = read_jsonl(args.traces)
        found = [f for f in map(trace_localisation, rows) if f is not None]
        summary = summarise(found)
        write_json(args.out, summary)
        run.log_artifact(args.out)
        if args.views is not None:
            for path in write_culprit_views(rows, found, args.views, args.n_views):
                run.log_artifact(path, "views")
        for part in ("all", "thinking", "answer"):
            s = summary[part]
            run.log_metrics({f"{part}/{key}": float(value) for key, value in s.items()})
            if s["traces"]:
                _log.info(
                    f"{part}: {s['traces']} wrong traces, culprit segment has the "
                    f"largest blame in {s['top_blame_rate']:.0%}, blame share {s['blame_share']:.2f} "
                    f"(chance {s['chance']:.2f}), σ share {s['sigma_share']:.2f} "
                    f"(token share {s['token_share']:.2f})",
                )
        if summary["thinking"]["traces"]:
            s = summary["thinking"]
            _log.info(
                f"thinking: the most-blamed thinking segment is the culprit in "
                f"{s['thinking_top_at_culprit']:.0%}, the one after it in {s['thinking_top_one_later']:.0%}",
            )
        _log.info(f"wrote {args.out}")


if __name__ == "__main__":
    setup_logging()
    main()
