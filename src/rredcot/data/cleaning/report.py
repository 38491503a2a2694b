"""The cleaner's report: flagged rows overall and per source and level, and the checks that ran;
scored against the synthetic task's injected ``noise`` when the rows carry it."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from rredcot.data.cleaning.checks import REASONS


def _fraction(num: int, den: int) -> float | None:
    """``num / den``, or ``None`` when the ratio is undefined."""
    return num / den if den else None


def _group_value(row: Mapping[str, Any] | None, field_name: str) -> str | None:
    """Report group of a row: numbers rounded half up (float difficulties), ``None`` when absent."""
    if row is None:
        return "<unreadable>"
    value = row.get(field_name)
    if isinstance(value, float) and math.isfinite(value):
        return str(math.floor(value + 0.5))
    return None if value is None else str(value)


def _group_order(key: str) -> tuple[bool, int, str]:
    """Numeric groups (levels) first and in numeric order, then the others alphabetically."""
    numeric = key.lstrip("-").isdigit()
    return (not numeric, int(key) if numeric else 0, key)


def _breakdown(rows: Sequence[Any], flags: Sequence[dict[str, Any]], field_name: str) -> dict[str, dict]:
    """Rows, flagged rows, their fraction and reason counts per value of ``field_name``."""
    groups: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)
    for row, flag in zip(rows, flags, strict=True):
        groups[_group_value(row, field_name) or "<none>"].append(flag)
    out = {}
    for key in sorted(groups, key=_group_order):
        members = groups[key]
        flagged = sum(flag["flagged"] for flag in members)
        counts = Counter(reason for flag in members for reason in flag["reasons"])
        out[key] = {
            "rows": len(members),
            "flagged": flagged,
            "fraction": _fraction(flagged, len(members)),
            "reasons": dict(counts.most_common()),
        }
    return out


def build_report(
    rows: Sequence[dict[str, Any] | None],
    flags: Sequence[dict[str, Any]],
    level_field: str,
    checks: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Summary of the flags, overall and per source and level; scored against ``noise`` when present."""
    flagged = sum(flag["flagged"] for flag in flags)
    reason_counts = Counter(reason for flag in flags for reason in flag["reasons"])
    by_source = _breakdown(rows, flags, "source")
    by_level = _breakdown(rows, flags, level_field)
    report: dict[str, Any] = {
        "total": len(rows),
        "flagged": flagged,
        "flagged_fraction": _fraction(flagged, len(rows)),
        # Every label reason (zeros included), then whichever input reasons fired.
        "reasons": {reason: reason_counts[reason] for reason in REASONS}
        | {reason: n for reason, n in sorted(reason_counts.items()) if reason not in REASONS},
        "flagged_fraction_by_source": {k: v["fraction"] for k, v in by_source.items() if k != "<none>"},
        "flagged_fraction_by_level": {k: v["fraction"] for k, v in by_level.items() if k != "<none>"},
        "by_source": by_source,
        "by_level": by_level,
    }
    if checks is not None:
        report["checks"] = dict(checks)
    if any(row is not None and "noise" in row for row in rows):
        report["noise"] = _noise_scores(rows, flags)
    return report


def _noise_scores(rows: Sequence[dict[str, Any] | None], flags: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Precision/recall of the flags against the synthetic ``noise`` truth column."""
    noisy = [row is not None and row.get("noise") is not None for row in rows]
    hit = [flag["flagged"] for flag in flags]
    true_pos = sum(n and h for n, h in zip(noisy, hit, strict=True))
    precision, recall = _fraction(true_pos, sum(hit)), _fraction(true_pos, sum(noisy))
    f1 = None
    if precision is not None and recall is not None:
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    by_kind: defaultdict[str, list[int]] = defaultdict(lambda: [0, 0])
    for row, flag, is_noisy in zip(rows, flags, noisy, strict=True):
        if is_noisy:
            by_kind[row["noise"]][0] += flag["flagged"]
            by_kind[row["noise"]][1] += 1
    return {
        "noisy": sum(noisy),
        "true_positives": true_pos,
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "recall_by_kind": {kind: caught / total for kind, (caught, total) in sorted(by_kind.items())},
    }


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


def format_table(report: dict[str, Any]) -> str:
    """The checks that ran and the per-source / per-level breakdown as aligned text tables."""
    out = []
    if "checks" in report:
        width = max(map(len, report["checks"]))
        out += ["checks:"] + [f"  {name:<{width}}  {state}" for name, state in report["checks"].items()]
        if "rows_without_solution" in report:
            out.append(f"  rows without a solution: {report['rows_without_solution']}")
    for title, key in (("source", "by_source"), ("level", "by_level")):
        groups = report.get(key) or {}
        width = max([len(title), *map(len, groups)])
        out.append(f"{title:<{width}}  {'rows':>7}  {'flagged':>7}  {'fraction':>8}  reasons")
        for name, group in groups.items():
            reasons = ", ".join(f"{reason}={n}" for reason, n in group["reasons"].items())
            fraction = "n/a" if group["fraction"] is None else f"{group['fraction']:.1%}"
            line = f"{name:<{width}}  {group['rows']:>7}  {group['flagged']:>7}  {fraction:>8}  {reasons}"
            out.append(line.rstrip())
    return "\n".join(out)
