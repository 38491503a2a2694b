"""``rredcot credit-view``: picture the credit a checkpoint assigns to the traces of any file.

    rredcot credit-view --config config/config.yaml --model results/train/rredcot/seed0/model \\
        --traces results/eval/rredcot/seed0.records.jsonl --data results/data/test.jsonl \\
        --out results/credit_view/rredcot-seed0 --limit 8

Each trace row needs a completion (``completion``, else ``greedy_completion``) and an ``answer``; the
prompt is ``prompt`` or the config's template applied to ``problem``; the reference solution is
``reference`` or the step-by-step part of ``solution``. Rows without a problem or solution (e.g.
evaluation records) are completed from ``--data`` by ``id``. The advantage's sign is the row's
``advantage`` if given, else +1 for a correct completion and -1 for a wrong one, so a wrong trace
shows where the blame goes. The credit method and its settings come from the config (``--arm``
picks an arm's method and options; default: the first arm whose method is not uniform). Writes
``trace_<i>.html``/``.png`` and ``traces.jsonl`` (the credit records) under ``--out``.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from rredcot.data.grading import grade
from rredcot.data.records import format_prompt, reference_solution
from rredcot.infra.io import read_jsonl
from rredcot.infra.logs import setup_logging
from rredcot.lm.modeling import load_model, load_tokenizer, set_threads
from rredcot.method.assign import CreditAssigner, credit_record
from rredcot.method.registry import TraceInput, credit_method
from rredcot.settings.config import load_config
from rredcot.viz.credit_view import write_views

_log = logging.getLogger(__name__)


def _pick_arm(cfg: Mapping[str, Any], arm: str | None) -> str:
    if arm is not None:
        if arm not in cfg["arms"]:
            raise SystemExit(f"unknown arm {arm!r}; configured arms: {', '.join(cfg['arms'])}")
        return arm
    for name, spec in cfg["arms"].items():
        if not credit_method(spec["credit"]).uniform:
            return name
    raise SystemExit("no arm with a non-uniform credit method in the config; pass --arm")


def trace_inputs(
    rows: Sequence[Mapping[str, Any]], by_id: Mapping[str, Mapping[str, Any]], template: str
) -> list[dict[str, Any]]:
    """Normalise trace rows to {id, prompt, completion, answer, reference, advantage}."""
    out = []
    for n, row in enumerate(rows):
        extra = by_id.get(str(row.get("id")), {})
        merged = {**extra, **row}
        completion = merged.get("completion", merged.get("greedy_completion"))
        if completion is None or merged.get("answer") is None:
            raise SystemExit(f"trace row {n}: needs 'completion' (or 'greedy_completion') and 'answer'")
        prompt = merged.get("prompt")
        if prompt is None:
            if merged.get("problem") is None:
                raise SystemExit(f"trace row {n}: no 'prompt' or 'problem' (pass --data to join by id)")
            prompt = format_prompt(template, merged["problem"])
        reference = merged.get("reference") or reference_solution(merged.get("solution")) or ""
        answer = str(merged["answer"])
        advantage = merged.get("advantage")
        if advantage is None:
            advantage = 1.0 if grade(completion, answer) else -1.0
        out.append(
            {
                "id": str(merged.get("id", n)),
                "prompt": prompt,
                "completion": completion,
                "answer": answer,
                "reference": reference,
                "advantage": float(advantage),
            }
        )
    return out


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", nargs="+", required=True, help="config YAML file(s), later ones override")
    ap.add_argument("--model", required=True, help="checkpoint directory (policy and value model)")
    ap.add_argument("--traces", required=True, help="JSONL file of traces")
    ap.add_argument("--data", help="JSONL split to complete trace rows by id (problem, solution)")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--arm", help="arm whose credit method and options to use")
    ap.add_argument("--limit", type=int, default=8, help="number of traces (from the top of the file)")
    args = ap.parse_args(argv)

    from rredcot.settings.config import credit_config  # the same config -> CreditConfig as training

    cfg = load_config(args.config)
    set_threads(cfg["threads"]["train"])
    arm = _pick_arm(cfg, args.arm)
    credit = credit_config(cfg, arm)
    by_id = {str(r["id"]): r for r in read_jsonl(args.data)} if args.data else {}
    rows = trace_inputs(read_jsonl(args.traces)[: args.limit], by_id, cfg["prompt"]["template"])
    tok = load_tokenizer(args.model)
    # Float32 weights, as training holds them (its credit passes run from the master weights).
    model = load_model(args.model, "float32").eval()
    assigner = CreditAssigner(tok, credit)
    items = [
        TraceInput(
            assigner.encode(r["prompt"]),
            assigner.encode(r["completion"]),
            r["advantage"],
            [(r["reference"], r["answer"])],
        )
        for r in rows
    ]
    _log.info(f"{len(items)} traces, method {credit.method} (arm {arm})")
    with torch.inference_mode():
        credits = assigner.assign(model, items)
    records = [
        credit_record(
            tokens=assigner.token_texts(item.completion_ids),
            credit=tc,
            method=credit.method,
            step=None,
            trace_id=r["id"],
            prompt=r["prompt"],
            answer=r["answer"],
            advantage=r["advantage"],
            reward=1.0 if r["advantage"] > 0 else 0.0,
            baseline_text=assigner.baseline_text(tc),
            mix=credit.mix,
        )
        for r, item, tc in zip(rows, items, credits, strict=True)
        if item.completion_ids
    ]
    paths = write_views(records, Path(args.out), stem="trace")
    _log.info(f"wrote {len(paths)} files under {args.out}")


if __name__ == "__main__":
    setup_logging()
    main()
