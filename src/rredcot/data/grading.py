"""Answer extraction and grading with math-verify.

Grading runs on every RL completion, so answer strings are parsed once and cached. math-verify's
timeouts rely on ``signal.alarm``, which only works in the main thread; elsewhere we run it without
its timeout rather than have it raise.
"""

from __future__ import annotations

import functools
import re
import threading
from dataclasses import dataclass
from typing import Any

# Seconds math-verify may spend on one parse / comparison (main thread only).
_TIMEOUT_S = 5
# A box command: \boxed, \fbox or \framebox, optional spaces, then its opening brace.
_BOX_RE = re.compile(r"\\(?:boxed|fbox|framebox)\s*\{")


@dataclass(frozen=True)
class BoxSpan:
    """Where one box command stands in a text: ``text[start:end]`` is the whole ``\\boxed{...}``,
    ``text[content_start:end - 1]`` its content; ``end`` is None when its braces never close."""

    start: int
    content_start: int
    end: int | None

    def content(self, text: str) -> str | None:
        return None if self.end is None else text[self.content_start : self.end - 1]


def box_spans(text: str) -> list[BoxSpan]:
    """Every box command of ``text`` in order, nested braces matched: the project's one parser of
    ``\\boxed{}`` (grading, answer positions, reference solutions and the label cleaner use it)."""
    spans = []
    for match in _BOX_RE.finditer(text):
        depth, end = 1, match.end()
        while end < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            end += 1
        spans.append(BoxSpan(match.start(), match.end(), end if depth == 0 else None))
    return spans


def last_box(text: str) -> BoxSpan | None:
    """The last box command of ``text`` (closed or not), or None."""
    spans = box_spans(text) if isinstance(text, str) else []
    return spans[-1] if spans else None


def extract_boxed(text: str) -> str | None:
    """The content of the last box command (``\\boxed{}``, ``\\fbox{}``, ``\\framebox{}``) in ``text``.

    ``None`` when there is no box or the last one never closes (a truncated answer is no answer).
    """
    span = last_box(text)
    return None if span is None else span.content(text)


def final_part(text: str, exit_string: str | None) -> str:
    """The part of a completion after its thinking block: the text after the first ``exit_string``.

    Whitespace around the marker is ignored (``"</think>\\n"`` also matches ``"</think>\\n\\n"``), as in
    segmentation. Without a marker in the text, or without a marker configured, the whole completion
    counts, so models that never close a thinking block are still graded.
    """
    needle = (exit_string or "").strip()
    at = text.find(needle) if needle else -1
    return text if at < 0 else text[at + len(needle) :]


def extract_answer(text: str, exit_string: str | None = None) -> str | None:
    """The final answer of a completion: the last boxed expression after the thinking block.

    A box written only inside the thinking block does not count once the block is closed: the
    model's answer is what it states after it.
    """
    if not isinstance(text, str):
        return None
    return extract_boxed(final_part(text, exit_string))


def _timeout() -> int | None:
    """math-verify timeout for the current thread (``None`` disables its signal-based alarm)."""
    return _TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def _has_math(candidates: tuple[Any, ...]) -> bool:
    """True iff math-verify produced a math object, not only its raw-string fallback."""
    return any(not isinstance(candidate, str) for candidate in candidates)


@functools.lru_cache(maxsize=1 << 16)
def _parse_answer(answer: str) -> tuple[Any, ...]:
    """Parse a bare answer string into math-verify's candidate tuple (empty when nothing was found).

    ``\\boxed{}`` wrapping lets math-verify's boxed extractor take the whole string (robust to ``$`` and
    ``\\text{}`` inside); ``$...$`` is the fallback because it tolerates trailing punctuation such as
    ``30^\\circ.``. A tuple keeps the cached value immutable.
    """
    from math_verify import parse  # imported on first use: it loads sympy (a second of every import)
    from math_verify.errors import TimeoutException

    result: tuple[Any, ...] = ()
    for wrapped in (f"\\boxed{{{answer}}}", f"${answer}$"):
        try:
            candidates = tuple(parse(wrapped, parsing_timeout=_timeout()))
        except (Exception, TimeoutException):
            continue
        if _has_math(candidates):
            return candidates
        # Keep the string fallback: math-verify can still compare answers such as names verbatim.
        result = result or candidates
    return result


def answers_equivalent(a: str, b: str) -> bool:
    """True iff answer string ``b`` is mathematically equivalent to reference answer ``a``.

    math-verify's comparison is not fully symmetric, so pass the reference first. Never raises.
    """
    if not isinstance(a, str) or not isinstance(b, str) or not a.strip() or not b.strip():
        return False
    gold, pred = _parse_answer(a.strip()), _parse_answer(b.strip())
    if not gold or not pred:
        return False
    from math_verify import verify
    from math_verify.errors import TimeoutException

    try:
        return bool(verify(list(gold), list(pred), timeout_seconds=_timeout()))
    except (Exception, TimeoutException):
        return False


def grade(prediction_text: str, gold: str, exit_string: str | None = None) -> bool:
    """True iff the final boxed answer in ``prediction_text`` is equivalent to ``gold``. Never raises.

    Only the last boxed answer counts (after the thinking block when ``exit_string`` is given, see
    :func:`extract_answer`), so an output without one is graded wrong.
    """
    predicted = extract_answer(prediction_text, exit_string)
    return predicted is not None and answers_equivalent(gold, predicted)


def parseable(answer: str) -> bool:
    """True iff math-verify turns ``answer`` into a math object (not just its string fallback)."""
    if not isinstance(answer, str) or not answer.strip():
        return False
    return _has_math(_parse_answer(answer.strip()))
