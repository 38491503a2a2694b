"""Checks of one row: is its label usable, its solution step-by-step and does it state the label?

Each row gets the reasons its label is doubtful (``check_row``); the input checks (``parse_line``,
``validate_row``) run first, on every line as read, and a row they flag is not checked further.
Resolvers re-derive a row's answer independently (the synthetic task exactly, a model by majority).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from rredcot.data import synthetic
from rredcot.data.grading import answers_equivalent, box_spans, parseable
from rredcot.infra.typed import at_least, within

Resolver = Callable[[dict[str, Any]], str | None]
"""Re-derives a row's answer independently; returns ``None`` when it has no opinion on the row."""

REASONS = (
    "unparseable_answer",
    "missing_solution",
    "not_stepwise",
    "solution_answer_mismatch",
    "resolve_mismatch",
    "duplicate",
    "near_duplicate",
    "eval_overlap",
)
REQUIRED_FIELDS = ("id", "problem", "answer")
# Equation signs: "=" (but not part of "<=", ">=", "!=", "==") and "\\equiv" for congruence chains.
_RELATION_RE = re.compile(r"(?<![<>!=])=(?!=)|\\equiv(?![a-zA-Z])")
# Sentence ends (punctuation followed by whitespace, so decimals like 3.5 do not split) or line breaks.
_SEGMENT_RE = re.compile(r"(?<=[.!?])\s+|\n+")
# "The answer is $x$" / "answer: \(x\)" / "the final answer is 501." (AoPS solutions without a box).
_ANSWER_IS_RE = re.compile(
    r"answer\s*(?:is|:)\s*:?\s*(?:\$+([^$]+?)\$+|\\\((.+?)\\\)|(-?\d[\d,]*(?:\.\d+)?|\([A-E]\))(?![\w^]))",
    re.IGNORECASE,
)
_WRAPPER_RE = re.compile(r"^\\(?:textbf|mathbf|text|mathrm)\s*\{(.*)\}$", re.DOTALL)
_PAREN_NUMBER_RE = re.compile(r"^\(\s*(-?\d+(?:\.\d+)?)\s*\)$")


@dataclass(frozen=True)
class CleanSettings:
    """Thresholds and switches of the cleaner (the ``clean`` config section; see the schema)."""

    min_solution_steps: int = field(default=2, metadata=at_least(0))
    require_solution: bool = True
    near_duplicate_threshold: float = field(default=0.75, metadata=within(0, 1, exclusive_minimum=True))
    shingle_size: int = field(default=5, metadata=at_least(1))
    minhash_permutations: int = field(default=128, metadata=at_least(1))
    near_duplicate_strict: bool = True
    max_field_chars: int = field(default=100_000, metadata=at_least(1))
    level_field: str = "level"
    resolve_model: str | None = None
    resolve_samples: int = field(default=5, metadata=at_least(1))
    resolve_max_new_tokens: int = field(default=1024, metadata=at_least(1))

    @classmethod
    def from_config(cls, section: Mapping[str, Any]) -> CleanSettings:
        """Settings from a config ``clean`` section (unknown keys are ignored)."""
        known = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in section.items() if key in known})


# --- resolvers ---------------------------------------------------------------------------------


def synthetic_resolver(row: dict[str, Any]) -> str | None:
    """Recompute synthetic problems exactly; no opinion on other sources."""
    return synthetic.solve(row.get("problem", "")) if row.get("source") == "synthetic" else None


DEFAULT_RESOLVERS: tuple[Resolver, ...] = (synthetic_resolver,)


def majority_resolver(sample_answers: Callable[[dict[str, Any]], Sequence[str | None]]) -> Resolver:
    """A resolver that contradicts the label only when most of ``k`` sampled answers do.

    ``sample_answers(row)`` returns ``k`` final answers (``None`` where a sample gave none). A sample
    without an answer is no evidence against the label, so it never counts towards the majority.
    """

    def resolve(row: dict[str, Any]) -> str | None:
        answers = list(sample_answers(row))
        label = row.get("answer")
        if not answers or not isinstance(label, str):
            return None
        wrong = [a for a in answers if a is not None and not answers_equivalent(label, a)]
        if 2 * len(wrong) > len(answers):
            return Counter(wrong).most_common(1)[0][0]
        return label

    resolve.__name__ = f"majority_of_{getattr(sample_answers, '__name__', 'samples')}"
    return resolve


def normalize_problem(text: str) -> str:
    """Key for exact-duplicate detection: case-folded with whitespace collapsed."""
    return " ".join(str(text).split()).casefold()


def _strip_boxes(text: str) -> str:
    """Remove every boxed answer so that stating the final answer does not count as a step."""
    for span in reversed([s for s in box_spans(text) if s.end is not None]):
        text = text[: span.start] + text[span.end :]
    return text


def final_answer(solution: str | None) -> str | None:
    """The final answer a solution states: its last box, else its last "answer is ..." phrase.

    AoPS-style texts hold several solutions one after another; each ends with the same answer, so the
    last one stands for all. ``None`` when nothing answer-like is found (then nothing is compared).
    """
    if not isinstance(solution, str):
        return None
    spans = [s for s in box_spans(solution) if s.end is not None]
    if spans:
        return spans[-1].content(solution).strip() or None
    phrases = list(_ANSWER_IS_RE.finditer(solution))
    if not phrases:
        return None
    return next(group for group in phrases[-1].groups() if group is not None).strip() or None


def _states_answer(answer: str, stated: str) -> bool:
    """True iff a solution's stated final answer matches the label, allowing AoPS decoration.

    AoPS solutions box AIME answers as ``\\textbf{(073)}``; math-verify reads that as text, so the
    wrapper and the parentheses around a bare number are dropped before a second comparison.
    """
    if answers_equivalent(answer, stated):
        return True
    bare = stated.strip()
    while (match := _WRAPPER_RE.match(bare)) is not None:
        bare = match.group(1).strip()
    bare = _PAREN_NUMBER_RE.sub(r"\1", bare)
    return bare != stated.strip() and answers_equivalent(answer, bare)


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
    row: dict[str, Any],
    resolvers: Sequence[Resolver] = DEFAULT_RESOLVERS,
    settings: CleanSettings | None = None,
) -> list[str]:
    """Label reasons for one row (empty if none), under ``settings`` (None: the defaults); duplicates
    are found across rows by :func:`clean_rows`."""
    settings = settings or CleanSettings()
    require_solution, min_solution_steps = settings.require_solution, settings.min_solution_steps
    reasons = []
    answer = row.get("answer")
    answer_ok = isinstance(answer, str) and parseable(answer)
    if not answer_ok:
        reasons.append("unparseable_answer")
    solution = row.get("solution")
    if not isinstance(solution, str) or not solution.strip():
        if require_solution:
            reasons.append("missing_solution")
        solution = None
    elif count_solution_steps(solution) < min_solution_steps:
        reasons.append("not_stepwise")
    # Comparisons need a usable reference answer; a broken one is already flagged above.
    if answer_ok:
        stated = final_answer(solution)
        # A solution without an extractable final answer cannot be compared, so it is not flagged.
        if stated is not None and not _states_answer(answer, stated):
            reasons.append("solution_answer_mismatch")
        for resolver in resolvers:
            resolved = resolver(row)
            if resolved is not None and not answers_equivalent(answer, resolved):
                reasons.append("resolve_mismatch")
                break
    return reasons


# --- robust input --------------------------------------------------------------------------------


@dataclass
class Line:
    """One input line: its 1-based number, the parsed object (``None`` if unusable), input reasons."""

    number: int
    row: dict[str, Any] | None
    reasons: list[str] = field(default_factory=list)


def parse_line(number: int, raw: bytes) -> Line:
    """Decode and parse one JSONL line without ever raising."""
    reasons = []
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        # Keep going on a lossy decode so the row's id can still be reported.
        reasons.append("invalid_utf8")
        text = raw.decode("utf-8", errors="replace")
    if not text.strip():
        return Line(number, None, [*reasons, "blank_line"])
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return Line(number, None, [*reasons, "malformed_json"])
    if not isinstance(value, dict):
        return Line(number, None, [*reasons, "not_an_object"])
    return Line(number, value, reasons)


def read_lines(path: str | Path) -> Iterator[Line]:
    """Every line of a JSONL file, read in binary so that no byte sequence can stop the reader."""
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            yield parse_line(number, raw)


def validate_row(row: Mapping[str, Any], max_field_chars: int) -> list[str]:
    """Schema reasons for a parsed row: missing, empty, wrongly typed or oversized fields."""
    reasons = []
    for name in REQUIRED_FIELDS:
        value = row.get(name)
        allowed = (str, int) if name == "id" else (str,)  # numeric ids are common; answers must be text
        if value is None:
            reasons.append(f"missing_field:{name}")
        elif isinstance(value, bool) or not isinstance(value, allowed):
            reasons.append(f"wrong_type:{name}")
        elif not str(value).strip():
            reasons.append(f"empty_field:{name}")
    if row.get("solution") is not None and not isinstance(row["solution"], str):
        reasons.append("wrong_type:solution")
    for key, value in row.items():
        size = len(value) if isinstance(value, str) else 0
        if isinstance(value, list | dict):
            size = len(json.dumps(value, ensure_ascii=False))
        if size > max_field_chars:
            reasons.append(f"oversized_field:{str(key)[:40]}")
    return reasons


def row_id(line: Line) -> Any:
    """The row's own id when it is usable, else ``line-<n>``."""
    value = line.row.get("id") if line.row is not None else None
    if isinstance(value, str | int) and not isinstance(value, bool) and str(value).strip():
        return value
    return f"line-{line.number}"
