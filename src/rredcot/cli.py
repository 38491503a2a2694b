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
            study-problems                               fresh problems for the PRM study (synthetic)
    rredcot tracking  ui|runs|server ...

Each stage is also ``python -m rredcot.<module>``; ``rredcot STAGE --help`` shows its options.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from rredcot.infra.logs import setup_logging

STAGES = {
    "data": "rredcot.stages.data:main",
    "study-problems": "rredcot.studies.problems:main",
    "fetch": "rredcot.stages.fetch:main",
    "datasets": "rredcot.tools.datasets:main",
    "clean": "rredcot.stages.clean:main",
    "sft": "rredcot.stages.sft:main",
    "train": "rredcot.stages.train:main",
    "launch": "rredcot.tools.launch:main",
    "evaluate": "rredcot.stages.evaluate:main",
    "report": "rredcot.stages.report:main",
    "bench": "rredcot.tools.bench:main",
    "bench-memory": "rredcot.tools.bench_memory:main",
    "gpu-check": "rredcot.tools.gpu_check:main",
    "tables": "rredcot.stages.tables:main",
    "claims": "rredcot.stages.claims:main",
    "credit-view": "rredcot.tools.credit_view:main",
    "study-traces": "rredcot.studies.traces:main",
    "study-mc": "rredcot.studies.mc:main",
    "study-mc-figures": "rredcot.studies.figures_mc:main",
    "study-attribution": "rredcot.studies.attribution:main",
    "study-prm-train": "rredcot.studies.prm_train:main",
    "study-prm": "rredcot.studies.prm:main",
    "study-attr-figures": "rredcot.studies.figures_attr:main",
    "study-localisation": "rredcot.studies.localisation:main",
    "tracking": "rredcot.tools.tracking:main",
    "config": "rredcot.tools.config:main",
}


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        raise SystemExit(0 if argv else 2)
    stage, rest = argv[0], argv[1:]
    if stage not in STAGES:
        raise SystemExit(f"rredcot: unknown stage {stage!r}; choose one of: {', '.join(STAGES)}")
    setup_logging()
    module, func = STAGES[stage].split(":")
    getattr(importlib.import_module(module), func)(rest)


if __name__ == "__main__":
    main()
