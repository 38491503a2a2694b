"""The fetch stage: one configured dataset (``data.kind: datasets``) as common-schema JSONL.

``rredcot fetch --config C --dataset NAME --out FILE``: NAME is ``train``, ``heldout`` or a name under
``data.benchmarks``; each names a registry entry (``data.registry``), a local file, or is an inline
spec. Hub datasets need network access.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence
from pathlib import Path

from rredcot.data.registry import load_dataset_spec, load_registry, resolve_dataset
from rredcot.infra.io import write_jsonl
from rredcot.infra.logs import setup_logging
from rredcot.infra.tracking import stage_run
from rredcot.settings.reads import stage_config

_log = logging.getLogger(__name__)


def main(argv: Sequence[str] | None = None) -> None:
    """Write one dataset of the config's ``data`` section (``data.kind: datasets``) as common-schema JSONL.

    ``--dataset`` is ``train``, ``heldout`` or a name under ``data.benchmarks``; each names a registry
    entry (``data.registry``), a local file, or is an inline spec. Hub datasets need network access.
    """

    ap = argparse.ArgumentParser(prog="rredcot fetch", description=__doc__)
    ap.add_argument("--config", nargs="+", required=True)
    ap.add_argument("--dataset", required=True, help="train, heldout or a benchmark name")
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args(argv)
    cfg = stage_config(args.config, "fetch")
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
        _log.info(f"{args.dataset}: {len(rows)} rows -> {args.out}")


if __name__ == "__main__":
    setup_logging()
    main()
