"""The ``rredcot`` command: one entry point for every pipeline stage.

    rredcot data      --config C --out-dir DIR          generate the sft/rl/test splits (synthetic task)
    rredcot fetch     --config C --dataset D --out F    one configured dataset (train, heldout or a
                                                        benchmark) in the common schema
    rredcot datasets  [NAME --out F | --list]           the dataset registry (config/datasets.yaml)
    rredcot clean     INPUT --out O --flags F --report R [--config C]
    rredcot sft       --config C --data sft.jsonl --out DIR
    rredcot train     --config C --arm A --seed N --model DIR --data rl.jsonl --eval-data test.jsonl --out DIR
    rredcot launch    train|sft STAGE-ARGS             the stage on the job's GPUs/nodes (accelerate launch,
                                                        vLLM server); one plain process by default
    rredcot evaluate  --config C --model DIR --data test.jsonl --out R.jsonl --summary S.json --arm A --seed N
    rredcot report    table|curve ...
    rredcot bench     --out results/bench/credit.json  credit-assignment cost benchmark
    rredcot bench-memory --out results/bench/memory.json  peak memory of each credit pass vs its budget
    rredcot gpu-check --out results/bench/gpu.json  paper-scale credit passes and steps on a CUDA GPU
    rredcot credit-view --config C --model DIR --traces T --out DIR   credit pictures of a trace file
    rredcot study-traces | study-mc | study-mc-figures | study-attribution | study-prm-train |
            study-prm | study-attr-figures ...           the paper's analyses (Figures 3-7)
            study-localisation                           where the blame of wrong traces lands (synthetic)
    rredcot tracking  ui|runs|server ...

Each stage is also ``python -m rredcot.<module>``; ``rredcot STAGE --help`` shows its options.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path

STAGES = {
    "data": "rredcot.cli:data_main",
    "fetch": "rredcot.cli:fetch_main",
    "datasets": "rredcot.datasets:main",
    "clean": "rredcot.cli:clean_main",
    "sft": "rredcot.sft:main",
    "train": "rredcot.train:main",
    "launch": "rredcot.launch:main",
    "evaluate": "rredcot.evaluate:main",
    "report": "rredcot.report:main",
    "bench": "rredcot.bench:main",
    "bench-memory": "rredcot.bench_memory:main",
    "gpu-check": "rredcot.gpu_check:main",
    "tables": "rredcot.tables:main",
    "credit-view": "rredcot.credit_view_cli:main",
    "study-traces": "rredcot.studies.traces:main",
    "study-mc": "rredcot.studies.mc:main",
    "study-mc-figures": "rredcot.studies.figures_mc:main",
    "study-attribution": "rredcot.studies.attribution:main",
    "study-prm-train": "rredcot.studies.prm_train:main",
    "study-prm": "rredcot.studies.prm:main",
    "study-attr-figures": "rredcot.studies.figures_attr:main",
    "study-localisation": "rredcot.studies.localisation:main",
    "tracking": "rredcot.tracking:main",
}


def data_main(argv: Sequence[str] | None = None) -> None:
    """Generate the configured dataset splits (synthetic task) and log them as one MLflow run."""
    from rredcot.config import load_config
    from rredcot.jsonl import write_jsonl
    from rredcot.synthetic import TaskConfig, generate_splits, summarize
    from rredcot.tracking import stage_run

    ap = argparse.ArgumentParser(prog="rredcot data", description=data_main.__doc__)
    ap.add_argument("--config", nargs="+", required=True)
    ap.add_argument("--out-dir", required=True, type=Path)
    args = ap.parse_args(argv)
    cfg = load_config(args.config)
    known = {f.name for f in fields(TaskConfig)}
    task = TaskConfig(**{k: v for k, v in cfg["data"]["synthetic"].items() if k in known})
    with stage_run(
        cfg,
        "data",
        rule="data",
        params={"data": cfg["data"]},
    ) as run:
        splits = generate_splits(task)
        for split, rows in splits.items():
            write_jsonl(args.out_dir / f"{split}.jsonl", rows)
            run.log_metrics({f"rows/{split}": len(rows)})
        summary = summarize(splits)
        print(summary)


def fetch_main(argv: Sequence[str] | None = None) -> None:
    """Write one dataset of the config's ``data`` section (``data.kind: datasets``) as common-schema JSONL.

    ``--dataset`` is ``train``, ``heldout`` or a name under ``data.benchmarks``; each names a registry
    entry (``data.registry``), a local file, or is an inline spec. Hub datasets need network access.
    """
    from rredcot.config import load_config
    from rredcot.datasets import load_dataset_spec, load_registry, resolve_dataset
    from rredcot.jsonl import write_jsonl
    from rredcot.tracking import stage_run

    ap = argparse.ArgumentParser(prog="rredcot fetch", description=fetch_main.__doc__)
    ap.add_argument("--config", nargs="+", required=True)
    ap.add_argument("--dataset", required=True, help="train, heldout or a benchmark name")
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args(argv)
    cfg = load_config(args.config)
    data = cfg["data"]
    if data["kind"] != "datasets":
        raise SystemExit("rredcot fetch: data.kind is not 'datasets' (the synthetic task: rredcot data)")
    choices = {"train": data["train"], "heldout": data["heldout"], **data["benchmarks"]}
    if args.dataset not in choices:
        raise SystemExit(f"rredcot fetch: no dataset {args.dataset!r}; choose from: {', '.join(choices)}")
    spec = resolve_dataset(choices[args.dataset], load_registry(data["registry"]))
    params = {"dataset": args.dataset, "spec": json.dumps(spec)}
    with stage_run(cfg, f"fetch-{args.dataset}", rule="fetch", params=params) as run:
        rows = load_dataset_spec(spec, root=Path(data["root"]))
        limit = data["max_rows"].get(args.dataset)
        if limit:
            rows = rows[:limit]
        write_jsonl(args.out, rows)
        run.log_metrics({"rows": len(rows)})
        print(f"[fetch] {args.dataset}: {len(rows)} rows -> {args.out}", flush=True)


def clean_main(argv: Sequence[str] | None = None) -> None:
    """Flag label errors; with ``--config`` the run is also logged to MLflow with its report."""
    from rredcot import clean

    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--config", nargs="+")
    known, rest = ap.parse_known_args(argv)
    if not known.config:
        clean.main(rest)
        return
    from rredcot.config import load_config
    from rredcot.tracking import stage_run

    cfg = load_config(known.config)
    with stage_run(
        cfg,
        "clean",
        rule="clean",
        params={"clean": cfg["clean"]},
    ) as run:
        clean.main(rest, settings=cfg["clean"])
        report_path = rest[rest.index("--report") + 1]
        with open(report_path) as fh:
            report = json.load(fh)
        # Nested numbers too: noise/precision, noise/recall, per-level flagged fractions.
        run.log_metrics(_numeric_leaves(report))
        run.log_artifact(report_path)


def _numeric_leaves(tree: dict, prefix: str = "") -> dict[str, float]:
    """Flatten the numbers of a nested report into ``a/b/c`` metric names."""
    out: dict[str, float] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_numeric_leaves(value, f"{name}/"))
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out[name] = float(value)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        raise SystemExit(0 if argv else 2)
    stage, rest = argv[0], argv[1:]
    if stage not in STAGES:
        raise SystemExit(f"rredcot: unknown stage {stage!r}; choose one of: {', '.join(STAGES)}")
    module, func = STAGES[stage].split(":")
    getattr(importlib.import_module(module), func)(rest)


if __name__ == "__main__":
    main()
