"""The data stage: ``rredcot data --config C --out-dir DIR`` writes the synthetic task's splits
(``sft``, ``rl``, ``test``; deterministic by seed, label noise injected into ``rl``) and logs them
as one MLflow run."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path

from rredcot.data.synthetic import TaskConfig, generate_splits, summarize
from rredcot.infra.io import write_jsonl
from rredcot.infra.logs import setup_logging
from rredcot.infra.tracking import stage_run
from rredcot.infra.typed import build
from rredcot.settings.reads import stage_config

_log = logging.getLogger(__name__)


def main(argv: Sequence[str] | None = None) -> None:
    """Generate the configured dataset splits (synthetic task) and log them as one MLflow run."""
    ap = argparse.ArgumentParser(prog="rredcot data", description=__doc__)
    ap.add_argument("--config", nargs="+", required=True)
    ap.add_argument("--out-dir", required=True, type=Path)
    args = ap.parse_args(argv)
    cfg = stage_config(args.config, "data")
    task = build(TaskConfig, cfg["data"]["synthetic"])  # the section is TaskConfig's own shape
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
        _log.info("%s", summary)


if __name__ == "__main__":
    setup_logging()
    main()
