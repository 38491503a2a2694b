"""The clean stage: ``rredcot clean INPUT --out CLEAN --flags FLAGS --report REPORT [--config C]``.

Cleans one JSONL file (:mod:`rredcot.data.cleaning`), writing the cleaned rows, one flags row per
input line and a JSON report atomically; with ``--config`` the config's ``clean`` section sets the
defaults (flags override them) and the run is logged to MLflow with its report.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rredcot.data.cleaning import (
    DEFAULT_RESOLVERS,
    CleanSettings,
    clean_lines,
    format_summary,
    format_table,
    load_eval_sets,
    read_lines,
)
from rredcot.infra.io import write_json, write_jsonl
from rredcot.infra.logs import setup_logging
from rredcot.lm.resolve import model_resolver


def _parser(defaults: CleanSettings) -> argparse.ArgumentParser:
    """Command-line options; every setting defaults to the config's ``clean`` section (see the schema)."""
    parser = argparse.ArgumentParser(description="Flag label errors in a JSONL file of math problems.")
    add, flag = parser.add_argument, argparse.BooleanOptionalAction
    add("input", type=Path, help="JSONL file in the common schema")
    add("--out", required=True, type=Path, help="cleaned JSONL (unflagged rows)")
    add("--flags", required=True, type=Path, help="JSONL with one flags row per input line")
    add("--report", required=True, type=Path, help="JSON report")
    add("--eval-sets", nargs="+", type=Path, default=[], help="JSONL evaluation sets (eval_overlap)")
    add("--min-solution-steps", type=int, default=defaults.min_solution_steps)
    add("--require-solution", action=flag, default=defaults.require_solution, help="missing_solution check")
    add("--near-duplicate-threshold", type=float, default=defaults.near_duplicate_threshold)
    add("--near-duplicate-strict", action=flag, default=defaults.near_duplicate_strict)
    add("--shingle-size", type=int, default=defaults.shingle_size)
    add("--minhash-permutations", type=int, default=defaults.minhash_permutations)
    add("--max-field-chars", type=int, default=defaults.max_field_chars)
    add("--level-field", default=defaults.level_field, help="row field grouped as the level in the report")
    add("--resolve-model", default=defaults.resolve_model, help="local model dir that re-solves each row")
    add("--resolve-samples", type=int, default=defaults.resolve_samples)
    add("--resolve-max-new-tokens", type=int, default=defaults.resolve_max_new_tokens)
    return parser


def clean_file(argv: Sequence[str], settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Clean one JSONL file as the command line says (no MLflow); returns the report.

    ``settings`` (a config ``clean`` section) or ``--config`` files set the defaults; the command line
    overrides them.
    """
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", nargs="+")
    known, argv = pre.parse_known_args(argv)
    section = dict(settings or {})
    if known.config:
        from rredcot.settings.reads import stage_config

        section = stage_config(known.config, "clean")["clean"] | section
    args = _parser(CleanSettings.from_config(section)).parse_args(argv)
    chosen = CleanSettings.from_config(vars(args))
    resolvers = list(DEFAULT_RESOLVERS)
    if chosen.resolve_model:
        resolvers.append(
            model_resolver(chosen.resolve_model, chosen.resolve_samples, chosen.resolve_max_new_tokens)
        )
    eval_rows, eval_info = (
        load_eval_sets(args.eval_sets, chosen.max_field_chars) if args.eval_sets else ([], None)
    )
    clean, flags, report = clean_lines(list(read_lines(args.input)), resolvers, chosen, eval_rows, eval_info)
    write_jsonl(args.out, clean)
    write_jsonl(args.flags, flags)
    write_json(args.report, report)
    print(format_summary(report))
    print(format_table(report))
    return report


def main(argv: Sequence[str] | None = None) -> None:
    """Flag label errors; with ``--config`` the config's clean section sets the defaults and the run
    is logged to MLflow with its report."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", nargs="+")
    known, rest = pre.parse_known_args(argv)
    if not known.config:
        clean_file(rest)
        return
    from rredcot.infra.tracking import stage_run
    from rredcot.settings.reads import stage_config

    cfg = stage_config(known.config, "clean")
    with stage_run(cfg, "clean", rule="clean", params={"clean": cfg["clean"]}) as run:
        report = clean_file(rest, cfg["clean"])
        # Nested numbers too: noise/precision, noise/recall, per-level flagged fractions.
        run.log_metrics(_numeric_leaves(report))
        run.log_artifact(rest[rest.index("--report") + 1])


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


if __name__ == "__main__":
    setup_logging()
    main()
