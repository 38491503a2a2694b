"""Fresh problems for the PRM study (synthetic task only):

    rredcot study-problems --config C --out study.jsonl

writes ``studies.prm.analysis_problems`` problems of the synthetic task's ``study`` split
(:func:`rredcot.data.synthetic.study_split`): disjoint from the ``sft``, ``rl`` and ``test`` splits,
which it leaves exactly as they are. A job of its own, so that sizing the PRM study never touches the
data the models train and are evaluated on. The PRM study then scores one trace of each
(``study-traces --set prm_analysis``): it needs no Monte Carlo rollouts, so it can afford the many
problems a small correlation needs (docs/testbed.md, "Sizing: the correlation studies")."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path

from rredcot.data.synthetic import TaskConfig, study_split
from rredcot.infra.io import write_jsonl
from rredcot.infra.logs import setup_logging
from rredcot.infra.tracking import stage_run
from rredcot.infra.typed import build
from rredcot.settings.reads import stage_config

_log = logging.getLogger(__name__)


def main(argv: Sequence[str] | None = None) -> None:
    """Write the synthetic task's study split and log it as one MLflow run."""
    ap = argparse.ArgumentParser(
        prog="rredcot study-problems",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--config", nargs="+", required=True, help="config YAML file(s), later ones override")
    ap.add_argument("--out", required=True, type=Path, help="the problems (JSONL)")
    args = ap.parse_args(argv)
    cfg = stage_config(args.config, "study_problems")
    n = int(cfg["studies"]["prm"]["analysis_problems"])
    if cfg["data"]["kind"] != "synthetic" or n < 1:
        raise SystemExit("study-problems needs data.kind synthetic and studies.prm.analysis_problems >= 1")
    task = build(TaskConfig, cfg["data"]["synthetic"])  # the section is TaskConfig's own shape
    params = {"data": cfg["data"], "analysis_problems": n}
    with stage_run(cfg, "study-problems", rule="study_problems", params=params) as run:
        rows = study_split(task, n)
        write_jsonl(args.out, rows)
        run.log_metrics({"rows/study": len(rows)})
        _log.info("%d fresh problems of the study split -> %s", len(rows), args.out)


if __name__ == "__main__":
    setup_logging()
    main()
