"""The text of the synthetic task: how a problem, its solution and a completion are written, and how
a problem text is read back.

A problem such as ``"Start at 7, add 5, times 3, minus 4. Work mod 10."`` has ``level`` operations
(:func:`problem_text`); a solution writes one equation per step and boxes the last result
(:func:`solution_text`); a completion holds its thinking, then ``THINK_END``, then its final
solution. :func:`parse_problem` reads a problem text back, and :func:`solve` recomputes its answer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

OP_WORDS = {"+": "add", "-": "minus", "*": "times"}
THINK_END = "</think>\n"

Step = tuple[str, int]


def apply_op(value: int, op: str, operand: int, modulus: int) -> int:
    """Result of one step, as a residue."""
    if op == "+":
        return (value + operand) % modulus
    if op == "-":
        return (value - operand) % modulus
    return (value * operand) % modulus


def run_chain(start: int, steps: Sequence[Step], modulus: int) -> list[int]:
    """Values after each step (``len(steps)`` values, the last one is the answer)."""
    values, value = [], start
    for op, operand in steps:
        value = apply_op(value, op, operand, modulus)
        values.append(value)
    return values


def problem_text(start: int, steps: Sequence[Step], modulus: int) -> str:
    """Problem statement, e.g. ``"Start at 7, add 5, times 3, minus 4. Work mod 10."``."""
    parts = [f"Start at {start}"] + [f"{OP_WORDS[op]} {operand}" for op, operand in steps]
    return f"{', '.join(parts)}. Work mod {modulus}."


def solution_text(start: int, steps: Sequence[Step], results: Sequence[int]) -> str:
    """Solution line from the results actually written, e.g. ``"7 + 5 = 2, 2 * 3 = 6. \\boxed{6}"``.

    Each equation starts from the previous written result, so a wrong result propagates.
    """
    equations, left = [], start
    for (op, operand), result in zip(steps, results, strict=True):
        equations.append(f"{left} {op} {operand} = {result}")
        left = result
    return f"{', '.join(equations)}. \\boxed{{{results[-1]}}}"


_WORD_OPS = {word: op for op, word in OP_WORDS.items()}
_PROBLEM_RE = re.compile(r"Start at (\d+)((?:\s*,\s*(?:add|minus|times)\s+\d+)+)\s*\.\s*Work mod (\d+)\s*\.")
_STEP_RE = re.compile(r"(add|minus|times)\s+(\d+)")


def parse_problem(problem: str) -> tuple[int, list[Step], int] | None:
    """(start, steps, modulus) of a problem text; ``None`` if it is not a synthetic problem."""
    match = _PROBLEM_RE.fullmatch(problem.strip()) if isinstance(problem, str) else None
    if match is None:
        return None
    modulus = int(match.group(3))
    if modulus < 1:
        return None
    steps = [(_WORD_OPS[word], int(operand)) for word, operand in _STEP_RE.findall(match.group(2))]
    return int(match.group(1)), steps, modulus


def solve(problem: str) -> str | None:
    """Recompute the answer of a problem text; ``None`` if it is not a synthetic problem."""
    parsed = parse_problem(problem)
    return None if parsed is None else str(run_chain(*parsed)[-1])
