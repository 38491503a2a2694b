"""Label-error cleaner for math datasets in the common schema (id, problem, answer, solution, source, level).

Each input line gets exactly one flags row ``{"id", "flagged", "reasons", ...}``; flagged rows are left
out of the cleaned file. The checks, in the order their reasons are listed:

* input (:mod:`.checks`): ``invalid_utf8``, ``blank_line``, ``malformed_json``, ``not_an_object``,
  ``missing_field:<f>``, ``empty_field:<f>``, ``wrong_type:<f>``, ``oversized_field:<f>``. A row with any
  of these is not checked further (its content cannot be trusted, and huge fields would stall the
  checks below).
* label (:mod:`.checks`): ``unparseable_answer`` (the grader could never match it), ``missing_solution``
  (switchable, because some sources ship no solutions), ``not_stepwise``, ``solution_answer_mismatch``
  (the solution's own final answer differs from the label), ``resolve_mismatch`` (an independent
  re-solver disagrees).
* redundancy (:mod:`.dedup`): ``duplicate`` (same normalised text as an earlier row), ``near_duplicate``
  (character-shingle Jaccard at or above a threshold, found with MinHash LSH), ``eval_overlap`` (the
  same or a near match of a problem in an evaluation set). Such rows carry ``duplicate_of`` /
  ``eval_match``.

When rows carry the synthetic ``noise`` truth column, the report (:mod:`.report`) scores the flags
against it. ``rredcot clean`` (``rredcot.stages.clean``) is the command line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rredcot.data.cleaning.checks import (
    DEFAULT_RESOLVERS,
    REASONS,
    CleanSettings,
    Line,
    Resolver,
    check_row,
    count_solution_steps,
    final_answer,
    majority_resolver,
    parse_line,
    read_lines,
    row_id,
    synthetic_resolver,
    validate_row,
)
from rredcot.data.cleaning.dedup import jaccard, mark_redundancy, near_text, shingles
from rredcot.data.cleaning.report import build_report, format_summary, format_table
from rredcot.infra.progress import progress

__all__ = [
    "DEFAULT_RESOLVERS",
    "REASONS",
    "CleanSettings",
    "Line",
    "Resolver",
    "build_report",
    "check_row",
    "clean_lines",
    "clean_rows",
    "count_solution_steps",
    "final_answer",
    "format_summary",
    "format_table",
    "jaccard",
    "load_eval_sets",
    "majority_resolver",
    "mark_redundancy",
    "near_text",
    "parse_line",
    "read_lines",
    "shingles",
    "synthetic_resolver",
    "validate_row",
]


def _checks(
    settings: CleanSettings, resolvers: Sequence[Resolver], eval_info: Mapping[str, Any] | None
) -> dict:
    """What each check did in this run, so that a switched-off check cannot go unnoticed."""
    names = ", ".join(getattr(r, "__name__", type(r).__name__) for r in resolvers) or "none"
    near = f"on (Jaccard >= {settings.near_duplicate_threshold} of {settings.shingle_size}-char shingles"
    near += ", same numbers and answer)" if settings.near_duplicate_strict else ")"
    checks = {
        "input": f"on (fields up to {settings.max_field_chars} chars)",
        "unparseable_answer": "on",
        "missing_solution": "on" if settings.require_solution else "OFF (clean.require_solution is false)",
        "not_stepwise": f"on (at least {settings.min_solution_steps} steps)",
        "solution_answer_mismatch": "on (only where the solution states a final answer)",
        "resolve_mismatch": f"on (resolvers: {names})" if resolvers else "OFF (no resolver)",
        "duplicate": "on",
        "near_duplicate": near,
        "eval_overlap": "OFF (no evaluation sets given)",
    }
    if eval_info:
        checks["eval_overlap"] = f"on ({eval_info['problems']} problems; exact or near as above)"
    return checks


def clean_lines(
    lines: Sequence[Line],
    resolvers: Sequence[Resolver] = DEFAULT_RESOLVERS,
    settings: CleanSettings | None = None,
    eval_rows: Sequence[dict[str, Any]] = (),
    eval_info: Mapping[str, Any] | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """Flag every line; returns ``(clean rows, flags, report)`` with one flags row per line, in order."""
    settings = settings or CleanSettings()
    if eval_rows and eval_info is None:
        eval_info = {"files": [], "problems": len(eval_rows), "skipped_lines": 0}
    reasons = [list(line.reasons) for line in lines]
    for line, found in zip(lines, reasons, strict=True):
        if line.row is not None:
            found += validate_row(line.row, settings.max_field_chars)
    usable = [i for i, line in enumerate(lines) if line.row is not None and not reasons[i]]
    for i in progress(usable, "checks"):
        reasons[i] += check_row(lines[i].row, resolvers, settings)
    ids = [row_id(line) for line in lines]
    extras: list[dict[str, Any]] = [{} for _ in lines]
    marks = mark_redundancy([lines[i].row for i in usable], [ids[i] for i in usable], settings, eval_rows)
    for i, mark in zip(usable, marks, strict=True):
        reasons[i] += mark.pop("reasons")
        extras[i] = mark
    flags = [
        {"id": ids[i], "flagged": bool(reasons[i]), "reasons": reasons[i], **extras[i]}
        for i in range(len(lines))
    ]
    clean = [line.row for line, flag in zip(lines, flags, strict=True) if not flag["flagged"]]
    rows = [line.row for line in lines]
    report = build_report(rows, flags, settings.level_field, _checks(settings, resolvers, eval_info))
    report["rows_without_solution"] = sum(
        1 for i in usable if not str(lines[i].row.get("solution") or "").strip()
    )
    report["settings"] = asdict(settings)
    if eval_info:
        report["eval_sets"] = dict(eval_info)
    return clean, flags, report


def clean_rows(
    rows: Sequence[dict[str, Any]],
    resolvers: Sequence[Resolver] = DEFAULT_RESOLVERS,
    *,
    settings: CleanSettings | None = None,
    eval_rows: Sequence[dict[str, Any]] = (),
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """Flag label errors in already-parsed rows under ``settings`` (None: the defaults); see
    :func:`clean_lines`.

    Returns the unflagged rows unchanged and in order, one ``{"id", "flagged", "reasons"}`` row per
    input row, and the report.
    """
    lines = [
        Line(n, row) if isinstance(row, dict) else Line(n, None, ["not_an_object"])
        for n, row in enumerate(rows, 1)
    ]
    return clean_lines(lines, resolvers, settings, eval_rows)


def load_eval_sets(paths: Sequence[str | Path], max_field_chars: int) -> tuple[list[dict], dict[str, Any]]:
    """Usable problems of the evaluation files; unusable lines are counted, not fatal."""
    rows, skipped = [], 0
    for path in paths:
        for line in read_lines(path):
            if line.row is not None and not line.reasons and not validate_row(line.row, max_field_chars):
                rows.append(line.row)
            else:
                skipped += 1
    return rows, {"files": [str(p) for p in paths], "problems": len(rows), "skipped_lines": skipped}
