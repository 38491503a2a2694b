"""Label-error cleaner for datasets in the common schema (id, problem, answer, solution, source).

Each row is run through a set of checks; any check that fires adds a reason and flags the row.
Flagged rows are dropped from the cleaned dataset, and one flags row per input row records why. When
rows carry the synthetic ``noise`` truth column, the report scores the flags against it.

Run ``python -m rredcot.clean INPUT.jsonl --out CLEAN.jsonl --flags FLAGS.jsonl --report REPORT.json``.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from rredcot import synthetic
from rredcot.grading import answers_equivalent, extract_boxed, parseable
from rredcot.jsonl import read_jsonl, write_json, write_jsonl

Resolver = Callable[[dict[str, Any]], str | None]
"""Re-derives a row's answer independently; returns ``None`` when it has no opinion on the row."""

REASONS = (
    "unparseable_answer",
    "missing_solution",
    "not_stepwise",
    "solution_answer_mismatch",
    "resolve_mismatch",
    "duplicate",
)
# Below this many rows a progress bar is just noise.
_PROGRESS_MIN_ROWS = 2000
# Equation signs: "=" (but not part of "<=", ">=", "!=", "==") and "\\equiv" for congruence chains.
_RELATION_RE = re.compile(r"(?<![<>!=])=(?!=)|\\equiv(?![a-zA-Z])")
# Sentence ends (punctuation followed by whitespace, so decimals like 3.5 do not split) or line breaks.
_SEGMENT_RE = re.compile(r"(?<=[.!?])\s+|\n+")
_BOX_RE = re.compile(r"\\(?:boxed|fbox)\{")


def synthetic_resolver(row: dict[str, Any]) -> str | None:
    """Recompute synthetic problems exactly; no opinion on other sources."""
    return synthetic.solve(row.get("problem", "")) if row.get("source") == "synthetic" else None


DEFAULT_RESOLVERS: tuple[Resolver, ...] = (synthetic_resolver,)


def normalize_problem(text: str) -> str:
    """Key for duplicate detection: case-folded with whitespace collapsed."""
    return " ".join(str(text).split()).casefold()


def _strip_boxes(text: str) -> str:
    """Remove every ``\\boxed{...}`` so that stating the final answer does not count as a step."""
    while (match := _BOX_RE.search(text)) is not None:
        depth, end = 1, match.end()
        while end < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            end += 1
        text = text[: match.start()] + text[end:]
    return text


def count_solution_steps(solution: str) -> int:
    """Number of reasoning steps in a solution: the larger of its equation and sentence/line counts.

    Equations capture chains like ``"7 + 5 = 2, 2 * 3 = 6"`` written in one sentence; sentences and
    lines capture prose solutions. The boxed final answer alone is not a step.
    """
    body = _strip_boxes(solution)
    equations = len(_RELATION_RE.findall(body))
    segments = [s for s in _SEGMENT_RE.split(body) if re.search(r"\w", s)]
    return max(equations, len(segments))


def check_row(
    row: dict[str, Any], resolvers: Sequence[Resolver] = DEFAULT_RESOLVERS, min_solution_steps: int = 2
) -> list[str]:
    """Reasons why ``row`` looks mislabeled (empty if none); duplicates are handled by :func:`clean_rows`."""
    reasons = []
    answer = row.get("answer")
    answer_ok = isinstance(answer, str) and parseable(answer)
    if not answer_ok:
        reasons.append("unparseable_answer")
    solution = row.get("solution")
    if not isinstance(solution, str) or not solution.strip():
        reasons.append("missing_solution")
        solution = None
    elif count_solution_steps(solution) < min_solution_steps:
        reasons.append("not_stepwise")
    # Comparisons need a usable reference answer; a broken one is already flagged above.
    if answer_ok:
        boxed = extract_boxed(solution) if solution else None
        # A solution without a boxed answer cannot be compared (common in AoPS-style solutions).
        if boxed is not None and not answers_equivalent(answer, boxed):
            reasons.append("solution_answer_mismatch")
        for resolver in resolvers:
            resolved = resolver(row)
            if resolved is not None and not answers_equivalent(answer, resolved):
                reasons.append("resolve_mismatch")
                break
    return reasons


def clean_rows(
    rows: Sequence[dict[str, Any]],
    resolvers: Sequence[Resolver] = DEFAULT_RESOLVERS,
    min_solution_steps: int = 2,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """Flag label errors in ``rows``.

    Returns ``(clean rows, flags, report)``: the unflagged rows unchanged and in order, one
    ``{"id", "flagged", "reasons"}`` row per input row in input order, and the report of
    :func:`build_report`.
    """
    clean, flags, seen = [], [], set()
    # disable=None lets tqdm hide itself when stderr is not a terminal (e.g. under a workflow manager).
    progress = tqdm(rows, desc="cleaning", unit="row", disable=len(rows) < _PROGRESS_MIN_ROWS or None)
    for index, row in enumerate(progress):
        reasons = check_row(row, resolvers, min_solution_steps)
        key = normalize_problem(row.get("problem", ""))
        if key in seen:
            reasons.append("duplicate")
        seen.add(key)
        flags.append({"id": row.get("id", index), "flagged": bool(reasons), "reasons": reasons})
        if not reasons:
            clean.append(row)
    return clean, flags, build_report(rows, flags)


def _fraction(num: int, den: int) -> float | None:
    """``num / den``, or ``None`` when the ratio is undefined."""
    return num / den if den else None


def _flag_rate_by(
    rows: Sequence[dict[str, Any]], flags: Sequence[dict[str, Any]], field: str
) -> dict[str, float]:
    """Flagged fraction per value of ``field`` (rows without the field are skipped)."""
    totals: defaultdict[str, list[int]] = defaultdict(lambda: [0, 0])
    for row, flag in zip(rows, flags, strict=True):
        if row.get(field) is not None:
            counts = totals[str(row[field])]
            counts[0] += flag["flagged"]
            counts[1] += 1
    return {key: flagged / total for key, (flagged, total) in sorted(totals.items())}


def build_report(rows: Sequence[dict[str, Any]], flags: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Summary of the flags, scored against the ``noise`` truth column when the rows have one."""
    flagged = sum(flag["flagged"] for flag in flags)
    reason_counts = Counter(reason for flag in flags for reason in flag["reasons"])
    report: dict[str, Any] = {
        "total": len(rows),
        "flagged": flagged,
        "flagged_fraction": _fraction(flagged, len(rows)),
        "reasons": {reason: reason_counts[reason] for reason in REASONS},
        "flagged_fraction_by_source": _flag_rate_by(rows, flags, "source"),
        "flagged_fraction_by_level": _flag_rate_by(rows, flags, "level"),
    }
    if any("noise" in row for row in rows):
        noisy = [row.get("noise") is not None for row in rows]
        hit = [flag["flagged"] for flag in flags]
        true_pos = sum(n and h for n, h in zip(noisy, hit, strict=True))
        precision, recall = _fraction(true_pos, sum(hit)), _fraction(true_pos, sum(noisy))
        f1 = None
        if precision is not None and recall is not None:
            f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        by_kind: defaultdict[str, list[int]] = defaultdict(lambda: [0, 0])
        for row, flag in zip(rows, flags, strict=True):
            if row.get("noise") is not None:
                by_kind[row["noise"]][0] += flag["flagged"]
                by_kind[row["noise"]][1] += 1
        report["noise"] = {
            "noisy": sum(noisy),
            "true_positives": true_pos,
            "precision": precision,
            "recall": recall,
            "f1": f1,
            "recall_by_kind": {kind: caught / total for kind, (caught, total) in sorted(by_kind.items())},
        }
    return report


def format_summary(report: dict[str, Any]) -> str:
    """One or two lines for the terminal."""
    line = f"flagged {report['flagged']}/{report['total']}"
    if report["flagged_fraction"] is not None:
        line += f" ({report['flagged_fraction']:.1%})"
    fired = ", ".join(f"{reason}={n}" for reason, n in report["reasons"].items() if n)
    if fired:
        line += f"; reasons: {fired}"
    noise = report.get("noise")
    if noise:
        scores = ", ".join(
            f"{name}={'n/a' if noise[name] is None else format(noise[name], '.3f')}"
            for name in ("precision", "recall", "f1")
        )
        line += f"\nagainst injected noise ({noise['noisy']} rows): {scores}"
    return line


def main(argv: Sequence[str] | None = None) -> None:
    """CLI: clean one JSONL file, writing the cleaned rows, the flags and a JSON report atomically."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("input", type=Path, help="JSONL file in the common schema")
    parser.add_argument("--out", required=True, type=Path, help="cleaned JSONL (unflagged rows)")
    parser.add_argument("--flags", required=True, type=Path, help="JSONL with one flags row per input row")
    parser.add_argument("--report", required=True, type=Path, help="JSON report")
    parser.add_argument("--min-solution-steps", type=int, default=2)
    args = parser.parse_args(argv)
    rows = read_jsonl(args.input)
    clean, flags, report = clean_rows(rows, min_solution_steps=args.min_solution_steps)
    write_jsonl(args.out, clean)
    write_jsonl(args.flags, flags)
    write_json(args.report, report)
    print(format_summary(report))


if __name__ == "__main__":
    main()
