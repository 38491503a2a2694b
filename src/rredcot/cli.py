"""The ``rredcot`` command: one entry point for every pipeline stage and tool.

``rredcot --help`` lists every command; the list is written from :data:`COMMANDS`, the table that
:func:`main` dispatches from, so it cannot name a command that does not run or leave one out.
``rredcot COMMAND --help`` shows a command's options.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
from collections.abc import Sequence
from typing import NamedTuple

from rredcot.infra.imports import UNUSED, skip_imports
from rredcot.infra.logs import setup_logging


class Command(NamedTuple):
    target: str
    """``module:function``; the function takes the command's arguments (argv without the command)."""
    usage: str
    """The arguments, as a synopsis (``rredcot COMMAND --help`` has them all)."""
    summary: str
    """What the command does, in one line."""


# In the order ``rredcot --help`` lists them: the pipeline's stages as the workflow runs them, then
# the paper's analyses, then the tools.
COMMANDS: dict[str, Command] = {
    "data": Command(
        "rredcot.stages.data:main",
        "--config C --out-dir DIR",
        "generate the sft/rl/test splits (synthetic task)",
    ),
    "fetch": Command(
        "rredcot.stages.fetch:main",
        "--config C --dataset D --out F",
        "one configured dataset (train, heldout or a benchmark) in the common schema",
    ),
    "datasets": Command(
        "rredcot.tools.datasets:main",
        "[NAME --out F | --list]",
        "the dataset registry (config/datasets.yaml)",
    ),
    "clean": Command(
        "rredcot.stages.clean:main", "INPUT --out O --flags F --report R [--config C]", "flag label errors"
    ),
    "model": Command(
        "rredcot.stages.model:main",
        "--config C --out DIR",
        "convert the pretrained model of model.gguf (a GGUF file in an installed package) into a checkpoint",
    ),
    "sft": Command("rredcot.stages.sft:main", "--config C --data sft.jsonl --out DIR", "the SFT warm-up"),
    "train": Command(
        "rredcot.stages.train:main",
        "--config C --arm A --seed N --model DIR --data rl.jsonl --eval-data test.jsonl --out DIR",
        "one GRPO training run of one method (arms.A) and seed",
    ),
    "launch": Command(
        "rredcot.tools.launch:main",
        "{train,sft} [--dry-run] STAGE-ARGS",
        "the stage on the job's GPUs/nodes (accelerate launch, vLLM server); one plain process by default",
    ),
    "evaluate": Command(
        "rredcot.stages.evaluate:main",
        "--config C --model DIR --data test.jsonl --out R.jsonl --summary S.json --arm A --seed N",
        "held-out accuracy of one model",
    ),
    "report": Command(
        "rredcot.stages.report:main",
        "--config C --summaries S... --curves C... --table T.csv --figure F.png [--paired P.csv] ...",
        "Table 1 (every method against the SFT model), paired differences and the learning curve",
    ),
    "tables": Command(
        "rredcot.stages.tables:main",
        "--config C --summaries S... --table2 T.csv --cost C.csv ...",
        "the paper's other tables: Table 2 (table2.csv) and the cost of each credit method",
    ),
    "claims": Command(
        "rredcot.stages.claims:main",
        "--config C --paired P.csv ... --csv claims.csv --md claims.md",
        "each claim of the paper with its measured value, interval and verdict",
    ),
    "study-traces": Command(
        "rredcot.studies.traces:main",
        "--config C --set SET --model DIR --data D --out F ...",
        "one sampled completion per problem, graded, with its RREDCoT credit",
    ),
    "study-mc": Command(
        "rredcot.studies.mc:main",
        "--config C --model DIR --traces T --out F ...",
        "Monte Carlo values at the exit points of study traces",
    ),
    "study-mc-figures": Command(
        "rredcot.studies.figures_mc:main",
        "--config C --traces T --mc M --out-dir DIR ...",
        "Figures 3 and 7 from the Monte Carlo study",
    ),
    "study-attribution": Command(
        "rredcot.studies.attribution:main",
        "--config C --model DIR --traces T --mc M --out F ...",
        "RREDCoT, leave-one-out, gradient norm and Monte Carlo credit of every thinking segment",
    ),
    "study-prm-train": Command(
        "rredcot.studies.prm_train:main",
        "--config C --model DIR --traces T --mc M --out DIR",
        "train the default config's own process reward model on Monte Carlo labelled steps",
    ),
    "study-prm": Command(
        "rredcot.studies.prm:main",
        "--config C --prm DIR --traces T --out F ...",
        "process reward model scores for every thinking segment",
    ),
    "study-attr-figures": Command(
        "rredcot.studies.figures_attr:main",
        "--config C --attributions A --prm P --out-dir DIR ...",
        "Figures 4-6: RREDCoT's credit against attribution methods, Monte Carlo values and a PRM",
    ),
    "study-localisation": Command(
        "rredcot.studies.localisation:main",
        "--config C --traces T --out F ...",
        "where the blame of wrong traces lands (synthetic task)",
    ),
    "study-fidelity": Command(
        "rredcot.studies.fidelity:main",
        "--config C --model DIR --traces T --data D --json F --csv F --figure F.png",
        "every credit method against the exact values, with its cost (synthetic task)",
    ),
    "study-problems": Command(
        "rredcot.studies.problems:main",
        "--config C --out F",
        "fresh problems for the PRM study (synthetic task)",
    ),
    "bench": Command(
        "rredcot.tools.bench:main",
        "[--out results/bench/credit.json]",
        "credit-assignment cost benchmark (writes results/bench/credit.json by default)",
    ),
    "bench-memory": Command(
        "rredcot.tools.bench_memory:main",
        "[--out F.json]",
        "peak memory of each credit pass against its budget (without --out it prints the results only)",
    ),
    "gpu-check": Command(
        "rredcot.tools.gpu_check:main",
        "[--out F.json] [--device cpu --tiny] [--profile DIR]",
        "paper-scale credit passes and steps on a CUDA GPU; without --out it prints the JSON report only "
        "(a run is published by committing its report as docs/gpu/gpu-check.json)",
    ),
    "credit-view": Command(
        "rredcot.tools.credit_view:main",
        "--config C --model DIR --traces T --out DIR",
        "credit pictures of a trace file",
    ),
    "tracking": Command(
        "rredcot.tools.tracking:main",
        "{ui,runs,server,sync} [--results-dir DIR]",
        "the MLflow store: its UI, a table of runs, a tracking server, and sync (deliver what jobs logged "
        "while the store was away)",
    ),
    "config": Command(
        "rredcot.tools.config:main",
        "--show C [C ...] | --write | --check",
        "a resolved config with every default filled in; the files written from the settings tree",
    ),
}

PIPELINE_MODULES: dict[str, str] = {
    "mlflow": "mlflow",
    "polars": "polars",
    "seaborn": "seaborn",
    "scipy": "scipy",
    "matplotlib": "matplotlib",
    "snakemake": "snakemake",
    "snakemake-executor-plugin-slurm": "snakemake_executor_plugin_slurm",
    "jsonschema": "jsonschema",
    "pyyaml": "yaml",
    "datasketch": "datasketch",
    "gguf": "gguf",
    "tenacity": "tenacity",
}
"""The packages of the ``pipeline`` extra (pyproject.toml), by the name pip installs, and the module
each is imported as. The library alone (``pip install rredcot``) has none of them; a command that
imports one says it needs the extra (:func:`main`). ``tests/test_cli.py`` checks the table against
pyproject.toml."""

PIPELINE_HINT = "pip install 'rredcot[pipeline]'"

STAGES: dict[str, str] = {name: command.target for name, command in COMMANDS.items()}
"""Command name -> ``module:function``, what :func:`main` dispatches to."""


def usage() -> str:
    """The text of ``rredcot --help``: every command of :data:`COMMANDS`, its synopsis and summary."""
    lines = [
        "usage: rredcot COMMAND [ARGS]   (rredcot COMMAND --help: the command's options)",
        "",
        "One entry point for every pipeline stage and tool. Commands:",
        "",
    ]
    for name, command in COMMANDS.items():
        lines.append(f"  rredcot {name} {command.usage}")
        lines += textwrap.wrap(command.summary, 100, initial_indent=" " * 6, subsequent_indent=" " * 6)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        raise SystemExit(0 if argv else 2)
    stage, rest = argv[0], argv[1:]
    if stage not in COMMANDS:
        raise SystemExit(f"rredcot: unknown command {stage!r}; choose one of: {', '.join(COMMANDS)}")
    setup_logging()
    skip_imports(*UNUSED)  # seconds of imports in every job (rredcot.infra.imports)
    module, func = COMMANDS[stage].target.split(":")
    try:
        getattr(importlib.import_module(module), func)(rest)
    except ModuleNotFoundError as exc:
        package = {m: p for p, m in PIPELINE_MODULES.items()}.get((exc.name or "").split(".")[0])
        if package is None:
            raise
        # The library-only install: one line that says what to install, not an import traceback.
        raise SystemExit(
            f"rredcot {stage}: needs the pipeline's packages ({package} is not installed): {PIPELINE_HINT}"
        ) from None


if __name__ == "__main__":
    main()
