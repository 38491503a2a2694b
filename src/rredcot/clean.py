"""Label-error cleaner for math datasets in the common schema (id, problem, answer, solution, source, level).

Each input line gets exactly one flags row ``{"id", "flagged", "reasons", ...}``; flagged rows are left
out of the cleaned file. The checks, in the order their reasons are listed:

* input: ``invalid_utf8``, ``blank_line``, ``malformed_json``, ``not_an_object``, ``missing_field:<f>``,
  ``empty_field:<f>``, ``wrong_type:<f>``, ``oversized_field:<f>``. A row with any of these is not
  checked further (its content cannot be trusted, and huge fields would stall the checks below).
* label: ``unparseable_answer`` (the grader could never match it), ``missing_solution`` (switchable,
  because some sources ship no solutions), ``not_stepwise``, ``solution_answer_mismatch`` (the
  solution's own final answer differs from the label), ``resolve_mismatch`` (an independent
  re-solver disagrees).
* redundancy: ``duplicate`` (same normalised text as an earlier row), ``near_duplicate`` (character
  shingle Jaccard at or above a threshold, found with MinHash/LSH), ``eval_overlap`` (the same or a
  near match of a problem in an evaluation set). Such rows carry ``duplicate_of`` / ``eval_match``.

When rows carry the synthetic ``noise`` truth column, the report scores the flags against it.

Run ``python -m rredcot.clean INPUT.jsonl --out CLEAN.jsonl --flags FLAGS.jsonl --report REPORT.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from tqdm import tqdm

from rredcot import synthetic
from rredcot.grading import answers_equivalent, parseable
from rredcot.jsonl import write_json, write_jsonl

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
# Below this many rows a progress bar is just noise.
_PROGRESS_MIN_ROWS = 2000
# Equation signs: "=" (but not part of "<=", ">=", "!=", "==") and "\\equiv" for congruence chains.
_RELATION_RE = re.compile(r"(?<![<>!=])=(?!=)|\\equiv(?![a-zA-Z])")
# Sentence ends (punctuation followed by whitespace, so decimals like 3.5 do not split) or line breaks.
_SEGMENT_RE = re.compile(r"(?<=[.!?])\s+|\n+")
_BOX_RE = re.compile(r"\\(?:boxed|fbox|framebox)\s*\{")
# "The answer is $x$" / "answer: \(x\)" / "the final answer is 501." (AoPS solutions without a box).
_ANSWER_IS_RE = re.compile(
    r"answer\s*(?:is|:)\s*:?\s*(?:\$+([^$]+?)\$+|\\\((.+?)\\\)|(-?\d[\d,]*(?:\.\d+)?|\([A-E]\))(?![\w^]))",
    re.IGNORECASE,
)
_WRAPPER_RE = re.compile(r"^\\(?:textbf|mathbf|text|mathrm)\s*\{(.*)\}$", re.DOTALL)
_PAREN_NUMBER_RE = re.compile(r"^\(\s*(-?\d+(?:\.\d+)?)\s*\)$")
_NEAR_DROP_RE = re.compile(r"\\[,;:! ]|\\[][()]|\\(?:left|right|displaystyle)(?![a-z])|[\s${}.,;:]")
_FRAC_RE = re.compile(r"\\[dt]frac(?![a-z])")


@dataclass(frozen=True)
class CleanSettings:
    """Thresholds and switches of the cleaner (the ``clean`` config section; see the schema)."""

    min_solution_steps: int = 2
    require_solution: bool = True
    near_duplicate_threshold: float = 0.75
    shingle_size: int = 5
    minhash_permutations: int = 128
    near_duplicate_strict: bool = True
    max_field_chars: int = 100_000
    level_field: str = "level"
    resolve_model: str | None = None
    resolve_samples: int = 5
    resolve_max_new_tokens: int = 1024

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


def model_resolver(
    model_dir: str | Path,
    k: int = 5,
    max_new_tokens: int = 1024,
    temperature: float = 0.7,
    prompt_template: str | None = None,
) -> Resolver:
    """Re-solve each problem with ``k`` samples from a (strong) causal LM; flag when most disagree.

    The prompt is ``prompt_template`` with ``{problem}`` filled in, else the tokenizer's chat template
    with a "final answer in \\boxed{}" instruction. Heavy imports happen here, not at module import.
    """
    import torch

    from rredcot.modeling import load_model, load_tokenizer

    tokenizer, model = load_tokenizer(model_dir), load_model(model_dir).eval()

    def prompt(problem: str) -> str:
        if prompt_template is not None:
            return prompt_template.replace("{problem}", problem)
        request = f"{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
        if tokenizer.chat_template:
            messages = [{"role": "user", "content": request}]
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return f"Problem: {request}\nSolution:"

    def sampled_answers(row: dict[str, Any]) -> list[str | None]:
        inputs = tokenizer(prompt(str(row.get("problem", ""))), return_tensors="pt")
        with torch.no_grad():
            output = model.generate(
                **inputs,
                do_sample=True,
                temperature=temperature,
                num_return_sequences=k,
                max_new_tokens=max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
            )
        texts = tokenizer.batch_decode(output[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
        return [final_answer(text) for text in texts]

    sampled_answers.__name__ = f"{Path(model_dir).name}_x{k}"
    return majority_resolver(sampled_answers)


# --- text checks -------------------------------------------------------------------------------


def normalize_problem(text: str) -> str:
    """Key for exact-duplicate detection: case-folded with whitespace collapsed."""
    return " ".join(str(text).split()).casefold()


def _box_spans(text: str) -> Iterator[tuple[int, int, int]]:
    """``(start, content_start, end)`` of every balanced ``\\boxed{...}``-like command, in order."""
    for match in _BOX_RE.finditer(text):
        depth, end = 1, match.end()
        while end < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            end += 1
        if depth == 0:
            yield match.start(), match.end(), end


def _strip_boxes(text: str) -> str:
    """Remove every boxed answer so that stating the final answer does not count as a step."""
    spans = list(_box_spans(text))
    for start, _, end in reversed(spans):
        text = text[:start] + text[end:]
    return text


def final_answer(solution: str | None) -> str | None:
    """The final answer a solution states: its last box, else its last "answer is ..." phrase.

    AoPS-style texts hold several solutions one after another; each ends with the same answer, so the
    last one stands for all. ``None`` when nothing answer-like is found (then nothing is compared).
    """
    if not isinstance(solution, str):
        return None
    spans = list(_box_spans(solution))
    if spans:
        _, content_start, end = spans[-1]
        return solution[content_start : end - 1].strip() or None
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
    min_solution_steps: int = 2,
    require_solution: bool = True,
) -> list[str]:
    """Label reasons for one row (empty if none); duplicates are found across rows by :func:`clean_rows`."""
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


def validate_row(row: Mapping[str, Any], max_field_chars: int = 100_000) -> list[str]:
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


def _row_id(line: Line) -> Any:
    """The row's own id when it is usable, else ``line-<n>``."""
    value = line.row.get("id") if line.row is not None else None
    if isinstance(value, str | int) and not isinstance(value, bool) and str(value).strip():
        return value
    return f"line-{line.number}"


# --- near duplicates ---------------------------------------------------------------------------


class Sketch(NamedTuple):
    """A text's sorted unique shingle hashes (for exact Jaccard) and its MinHash signature."""

    shingles: np.ndarray
    signature: np.ndarray


def near_text(text: str) -> str:
    """Normalisation for near-duplicate detection: only the letters, digits and operators remain.

    Case, spacing, math delimiters, braces, sentence punctuation and LaTeX spacing commands vary
    between copies of the same problem (``$a_1=2007$.`` vs ``$a_1 = 2007.$``), so they are dropped;
    operators such as ``-`` and ``<`` change the problem, so they stay.
    """
    text = _FRAC_RE.sub("frac", str(text).casefold())
    return _NEAR_DROP_RE.sub("", text)


def _mix64(values: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser: a strong bijective scramble of 64-bit integers (wrapping arithmetic)."""
    values = (values ^ (values >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    values = (values ^ (values >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return values ^ (values >> np.uint64(31))


def shingle_hashes(text: str, size: int) -> np.ndarray:
    """Sorted unique 64-bit hashes of the ``size``-character shingles of ``text``.

    A polynomial rolling hash over code points, vectorised in numpy: stable across processes (unlike
    ``hash``) and fast enough for tens of thousands of rows. Texts shorter than ``size`` are one shingle.
    """
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)
    if codes.size == 0:
        return np.zeros(0, dtype=np.uint64)
    width = min(size, codes.size)
    count = codes.size - width + 1
    hashes = np.zeros(count, dtype=np.uint64)
    for offset in range(width):
        hashes = hashes * np.uint64(1_000_003) + codes[offset : offset + count]  # wraps modulo 2**64
    return np.unique(_mix64(hashes))


class MinHasher:
    """MinHash signatures over character shingles; permutation ``i`` is ``mix64(x ^ seed_i)``.

    A strong mixer matters: with weakly mixed permutations such as ``a * x + b mod 2**61 - 1`` on
    32-bit ``x`` the minima of different permutations land on the same few shingles, and the share of
    equal signature entries no longer estimates the Jaccard similarity.
    """

    def __init__(self, shingle_size: int = 5, num_perm: int = 128, seed: int = 0) -> None:
        self.shingle_size, self.num_perm = shingle_size, num_perm
        self._seeds = np.random.default_rng(seed).integers(0, 1 << 63, num_perm, dtype=np.uint64)

    def sketch(self, text: str) -> Sketch:
        """Shingles and signature of ``text`` after :func:`near_text` normalisation."""
        shingles = shingle_hashes(near_text(text), self.shingle_size)
        signature = np.full(self.num_perm, np.iinfo(np.uint64).max, dtype=np.uint64)
        for start in range(0, shingles.size, 2048):  # bounded memory for long texts
            chunk = shingles[start : start + 2048, None]
            signature = np.minimum(signature, _mix64(chunk ^ self._seeds).min(axis=0))
        return Sketch(shingles, signature)


def jaccard(a: Sketch, b: Sketch) -> float:
    """Exact Jaccard similarity of two shingle sets."""
    inter = np.intersect1d(a.shingles, b.shingles, assume_unique=True).size
    union = a.shingles.size + b.shingles.size - inter
    return inter / union if union else 0.0


def rows_per_band(threshold: float, num_perm: int, recall: float = 0.99) -> int:
    """Largest LSH band width whose chance to pair two sketches at ``threshold`` is at least ``recall``.

    Two sketches with Jaccard ``s`` share a band with probability ``1 - (1 - s**r) ** (num_perm // r)``;
    wider bands mean fewer false candidates to verify, so take the widest that still meets ``recall``.
    """
    best = 1
    for width in range(1, num_perm + 1):
        if 1 - (1 - threshold**width) ** (num_perm // width) >= recall:
            best = width
    return best


class LshIndex:
    """MinHash LSH banding; candidates are verified with exact Jaccard, so it only ever misses pairs."""

    def __init__(self, threshold: float, num_perm: int) -> None:
        self.threshold = threshold
        self.width = rows_per_band(threshold, num_perm)
        self.bands = num_perm // self.width
        self._buckets: defaultdict[tuple[int, bytes], list[int]] = defaultdict(list)
        self._entries: list[tuple[Any, Sketch]] = []

    def _keys(self, sketch: Sketch) -> list[tuple[int, bytes]]:
        sig, w = sketch.signature, self.width
        return [(band, sig[band * w : (band + 1) * w].tobytes()) for band in range(self.bands)]

    def add(self, key: Any, sketch: Sketch) -> None:
        """Index ``sketch`` under ``key``."""
        if not sketch.shingles.size:
            return
        self._entries.append((key, sketch))
        for bucket in self._keys(sketch):
            self._buckets[bucket].append(len(self._entries) - 1)

    def best_match(
        self, sketch: Sketch, accept: Callable[[Any], bool] | None = None
    ) -> tuple[Any, float] | None:
        """The most similar indexed key with Jaccard at or above the threshold that ``accept`` allows."""
        if not sketch.shingles.size:
            return None
        candidates = {index for bucket in self._keys(sketch) for index in self._buckets.get(bucket, ())}
        scored = ((jaccard(sketch, self._entries[i][1]), i) for i in sorted(candidates))
        # Best first, so that ``accept`` (possibly an answer comparison) runs as rarely as possible.
        for score, index in sorted(
            (pair for pair in scored if pair[0] >= self.threshold), key=lambda p: -p[0]
        ):
            key = self._entries[index][0]
            if accept is None or accept(key):
                return key, score
        return None


# --- cleaning ----------------------------------------------------------------------------------


def _progress(items: Sequence[Any], desc: str) -> Any:
    # disable=None lets tqdm hide itself when stderr is not a terminal (e.g. under a workflow manager).
    return tqdm(items, desc=desc, unit="row", disable=len(items) < _PROGRESS_MIN_ROWS or None)


def same_answer(a: Any, b: Any) -> bool:
    """True iff two labels agree: identical text (spacing aside) or math-verify equivalent."""
    if not isinstance(a, str) or not isinstance(b, str):
        return False
    return "".join(a.split()) == "".join(b.split()) or answers_equivalent(a, b)


def _digits(text: str) -> str:
    """All digits of a text in order: copies keep their numbers, variants usually change one."""
    return re.sub(r"\D", "", text)


class _Corpus:
    """Rows indexed for redundancy checks: exact normalised text plus MinHash LSH for near matches."""

    def __init__(self, hasher: MinHasher, settings: CleanSettings) -> None:
        self.index = LshIndex(settings.near_duplicate_threshold, hasher.num_perm)
        self.exact: dict[str, int] = {}
        self.rows: list[tuple[Any, str, str]] = []  # (id, answer, digits) by position
        self.strict = settings.near_duplicate_strict

    def add(self, row_id: Any, row: dict[str, Any], sketch: Sketch) -> None:
        self.rows.append((row_id, row["answer"], _digits(row["problem"])))
        self.exact.setdefault(normalize_problem(row["problem"]), len(self.rows) - 1)
        self.index.add(len(self.rows) - 1, sketch)

    def near(self, row: dict[str, Any], sketch: Sketch) -> Any:
        """Id of the best near match; when strict, only rows with the same numbers and label count.

        Measured on MATH train, near-identical texts that differ in a number or in the answer are
        nearly always deliberate variants ("... divided by 8?" vs "... by 9?"), not copies.
        """
        accept = None
        if self.strict:
            digits = _digits(row["problem"])

            def accept(pos: int) -> bool:
                _, answer, other_digits = self.rows[pos]
                return other_digits == digits and same_answer(answer, row["answer"])

        match = self.index.best_match(sketch, accept)
        return None if match is None else self.rows[match[0]][0]


def mark_redundancy(
    rows: Sequence[dict[str, Any]],
    ids: Sequence[Any],
    settings: CleanSettings,
    eval_rows: Sequence[dict[str, Any]],
) -> list[dict[str, Any]]:
    """Per row: the redundancy reasons and the ids they point to (``duplicate_of``, ``eval_match``)."""
    hasher = MinHasher(settings.shingle_size, settings.minhash_permutations)
    seen, evals = _Corpus(hasher, settings), _Corpus(hasher, settings)
    for number, row in enumerate(eval_rows):
        evals.add(row.get("id", f"eval-{number}"), row, hasher.sketch(row["problem"]))
    marks = []
    for row, row_id in zip(_progress(rows, "duplicates"), ids, strict=True):
        mark: dict[str, Any] = {"reasons": []}
        key = normalize_problem(row["problem"])
        sketch = hasher.sketch(row["problem"])
        if key in seen.exact:
            mark["reasons"].append("duplicate")
            mark["duplicate_of"] = seen.rows[seen.exact[key]][0]
        else:
            # Only first occurrences are indexed: a later exact copy is already caught above.
            if (match := seen.near(row, sketch)) is not None:
                mark["reasons"].append("near_duplicate")
                mark["duplicate_of"] = match
            seen.add(row_id, row, sketch)
        if key in evals.exact:
            overlap = evals.rows[evals.exact[key]][0]
        else:
            overlap = evals.near(row, sketch) if eval_rows else None
        if overlap is not None:
            mark["reasons"].append("eval_overlap")
            mark["eval_match"] = overlap
        marks.append(mark)
    return marks


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
    settings: CleanSettings = CleanSettings(),
    eval_rows: Sequence[dict[str, Any]] = (),
    eval_info: Mapping[str, Any] | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """Flag every line; returns ``(clean rows, flags, report)`` with one flags row per line, in order."""
    if eval_rows and eval_info is None:
        eval_info = {"files": [], "problems": len(eval_rows), "skipped_lines": 0}
    reasons = [list(line.reasons) for line in lines]
    for line, found in zip(lines, reasons, strict=True):
        if line.row is not None:
            found += validate_row(line.row, settings.max_field_chars)
    usable = [i for i, line in enumerate(lines) if line.row is not None and not reasons[i]]
    for i in _progress(usable, "checks"):
        reasons[i] += check_row(
            lines[i].row, resolvers, settings.min_solution_steps, settings.require_solution
        )
    ids = [_row_id(line) for line in lines]
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
    min_solution_steps: int = 2,
    *,
    settings: CleanSettings | None = None,
    eval_rows: Sequence[dict[str, Any]] = (),
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """Flag label errors in already-parsed rows; see :func:`clean_lines`.

    Returns the unflagged rows unchanged and in order, one ``{"id", "flagged", "reasons"}`` row per
    input row, and the report. ``settings`` (when given) wins over ``min_solution_steps``.
    """
    settings = settings or CleanSettings(min_solution_steps=min_solution_steps)
    lines = [
        Line(n, row) if isinstance(row, dict) else Line(n, None, ["not_an_object"])
        for n, row in enumerate(rows, 1)
    ]
    return clean_lines(lines, resolvers, settings, eval_rows)


# --- report ------------------------------------------------------------------------------------


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
    level_field: str = "level",
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


# --- CLI ---------------------------------------------------------------------------------------


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


def _parser(defaults: CleanSettings) -> argparse.ArgumentParser:
    """Command-line options; every setting defaults to the config's ``clean`` section (see the schema)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add, flag = parser.add_argument, argparse.BooleanOptionalAction
    add("input", type=Path, help="JSONL file in the common schema")
    add("--out", required=True, type=Path, help="cleaned JSONL (unflagged rows)")
    add("--flags", required=True, type=Path, help="JSONL with one flags row per input line")
    add("--report", required=True, type=Path, help="JSON report")
    add("--config", nargs="+", help="config file(s) whose clean section sets the defaults")
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


def main(argv: Sequence[str] | None = None, settings: Mapping[str, Any] | None = None) -> None:
    """CLI: clean one JSONL file, writing the cleaned rows, the flags and a JSON report atomically.

    ``settings`` (a config ``clean`` section) or ``--config`` set the defaults; flags override them.
    """
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", nargs="+")
    section = dict(settings or {})
    if config := pre.parse_known_args(argv)[0].config:
        from rredcot.config import load_config

        section = load_config(config)["clean"] | section
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


if __name__ == "__main__":
    main()
