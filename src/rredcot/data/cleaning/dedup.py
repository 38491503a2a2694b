"""Exact and near duplicates, within a dataset and against evaluation sets.

Exact: the same problem text once case and whitespace are normalised. Near: a character-shingle
Jaccard similarity of the texts (letters, digits and operators only, see :func:`near_text`) at or
above ``near_duplicate_threshold``. Candidate pairs come from datasketch's MinHash LSH, banded for 99%
recall at the threshold, and each is verified with the exact Jaccard of the shingle sets, so the LSH
only decides which pairs get compared. With ``near_duplicate_strict`` a near match also needs the
same digits in the same order and an equivalent label (near-identical texts that differ in a number
are deliberate variants, not copies).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from rredcot.data.cleaning.checks import CleanSettings, normalize_problem
from rredcot.data.grading import answers_equivalent
from rredcot.infra.progress import progress

if TYPE_CHECKING:
    from datasketch import MinHash

_NEAR_DROP_RE = re.compile(r"\\[,;:! ]|\\[][()]|\\(?:left|right|displaystyle)(?![a-z])|[\s${}.,;:]")
_FRAC_RE = re.compile(r"\\[dt]frac(?![a-z])")
RECALL = 0.99  # the LSH's chance to compare a pair right at the threshold


def near_text(text: str) -> str:
    """Normalisation for near-duplicate detection: only the letters, digits and operators remain.

    Case, spacing, math delimiters, braces, sentence punctuation and LaTeX spacing commands vary
    between copies of the same problem (``$a_1=2007$.`` vs ``$a_1 = 2007.$``), so they are dropped;
    operators such as ``-`` and ``<`` change the problem, so they stay.
    """
    text = _FRAC_RE.sub("frac", str(text).casefold())
    return _NEAR_DROP_RE.sub("", text)


def shingles(text: str, size: int) -> frozenset[str]:
    """The ``size``-character shingles of ``text`` after :func:`near_text` (a shorter text is one)."""
    text = near_text(text)
    if not text:
        return frozenset()
    width = min(size, len(text))
    return frozenset(text[i : i + width] for i in range(len(text) - width + 1))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    """Exact Jaccard similarity of two shingle sets."""
    union = len(a | b)
    return len(a & b) / union if union else 0.0


def rows_per_band(threshold: float, num_perm: int, recall: float = RECALL) -> int:
    """Largest LSH band width whose chance to pair two sketches at ``threshold`` is at least ``recall``.

    Two sketches with Jaccard ``s`` share a band with probability ``1 - (1 - s**r) ** (num_perm // r)``;
    wider bands mean fewer false candidates to verify, so take the widest that still meets ``recall``.
    """
    best = 1
    for width in range(1, num_perm + 1):
        if 1 - (1 - threshold**width) ** (num_perm // width) >= recall:
            best = width
    return best


class Sketcher:
    """Shingle sets and their MinHash signatures (datasketch), all with the same permutations."""

    def __init__(self, shingle_size: int, num_perm: int, seed: int = 1) -> None:
        self.shingle_size, self.num_perm, self.seed = shingle_size, num_perm, seed

    def sketch(self, text: str) -> tuple[frozenset[str], MinHash]:
        from datasketch import MinHash  # on first use: it loads scipy

        grams = shingles(text, self.shingle_size)
        signature = MinHash(num_perm=self.num_perm, seed=self.seed)
        signature.update_batch([g.encode("utf-8") for g in sorted(grams)])
        return grams, signature


class NearIndex:
    """MinHash LSH over shingle sets; candidates are verified with exact Jaccard, so it only ever
    misses pairs (with probability below 1 - RECALL at the threshold, less above it)."""

    def __init__(self, threshold: float, num_perm: int) -> None:
        self.threshold = threshold
        from datasketch import MinHashLSH

        width = rows_per_band(threshold, num_perm)
        self.lsh = MinHashLSH(num_perm=num_perm, params=(num_perm // width, width))
        self.grams: list[frozenset[str]] = []

    def add(self, key: int, sketch: tuple[frozenset[str], MinHash]) -> None:
        """Index a sketch under ``key`` (its position: keys are 0, 1, 2, ... in order)."""
        grams, signature = sketch
        self.grams.append(grams)
        if grams:
            self.lsh.insert(key, signature)

    def best_match(
        self, sketch: tuple[frozenset[str], MinHash], accept: Callable[[int], bool] | None = None
    ) -> tuple[int, float] | None:
        """The most similar indexed key with Jaccard at or above the threshold that ``accept`` allows."""
        grams, signature = sketch
        if not grams:
            return None
        scored = ((jaccard(grams, self.grams[key]), key) for key in sorted(self.lsh.query(signature)))
        # Best first, so that ``accept`` (possibly an answer comparison) runs as rarely as possible.
        for score, key in sorted((p for p in scored if p[0] >= self.threshold), key=lambda p: (-p[0], p[1])):
            if accept is None or accept(key):
                return key, score
        return None


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

    def __init__(self, settings: CleanSettings) -> None:
        self.index = NearIndex(settings.near_duplicate_threshold, settings.minhash_permutations)
        self.exact: dict[str, int] = {}
        self.rows: list[tuple[Any, str, str]] = []  # (id, answer, digits) by position
        self.strict = settings.near_duplicate_strict

    def add(self, row_id: Any, row: dict[str, Any], sketch: tuple[frozenset[str], MinHash]) -> None:
        self.rows.append((row_id, row["answer"], _digits(row["problem"])))
        self.exact.setdefault(normalize_problem(row["problem"]), len(self.rows) - 1)
        self.index.add(len(self.rows) - 1, sketch)

    def near(self, row: dict[str, Any], sketch: tuple[frozenset[str], MinHash]) -> Any:
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
    hasher = Sketcher(settings.shingle_size, settings.minhash_permutations)
    seen, evals = _Corpus(settings), _Corpus(settings)
    for number, row in enumerate(eval_rows):
        evals.add(row.get("id", f"eval-{number}"), row, hasher.sketch(row["problem"]))
    marks = []
    for row, row_id in zip(progress(rows, "duplicates"), ids, strict=True):
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
