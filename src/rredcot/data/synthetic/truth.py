"""Where a completion of the synthetic task goes wrong, and what each of its prefixes is worth: the
ground truth that the ``oracle`` and ``exact`` credit methods are given.

- :func:`culprit` / :func:`culprit_offset`: the first wrong step of a wrong trace, the ``oracle``'s
  knowledge (``RREDCoTTrainer(culprit=...)``).
- :func:`exact_values` / :func:`exact_value_functions`: the probability that a completion ends right
  from each exit point, computed exactly from the task (:func:`chain_value`) at the batch's own slip
  rate (:func:`step_errors`, :func:`batch_slip_rate`), the ``exact`` method's knowledge
  (``RREDCoTTrainer(task_values=...)``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rredcot.data.grading import grade
from rredcot.data.synthetic.grammar import THINK_END, Step, apply_op, parse_problem, run_chain

# The value a step starts from is optional: thinking lines may hold the step alone ("* 4 = 4").
_EQUATION = re.compile(r"(\d+\s*)?([-+*])\s*(\d+)\s*=\s*(\d+)")


def culprit(problem: str, completion: str) -> tuple[str, int] | None:
    """The culprit of a wrong trace, its first wrong step: (``"thinking"`` or ``"answer"``, character
    offset in the completion) of where the trace goes wrong, or None when the problem is not
    synthetic or the final answer is right. The offset is that of the wrong value in the thinking
    line that set it, or of the exit string that opens the final solution.

    The final answer inherits its error from the first wrong value of the final solution. When the
    thinking kept that same wrong value for that step, the solution copied it: the culprit is the
    thinking line that set it. Otherwise the solution went wrong on its own (a slip in copying, or in
    a step it computed itself; a thinking error it did not copy did not matter): the culprit is the
    answer segment. Without a final solution the first wrong kept value of the thinking is taken.
    """
    parsed = parse_problem(problem)
    if parsed is None:
        return None
    start, steps, modulus = parsed
    truth = run_chain(start, steps, modulus)
    end = completion.find(THINK_END.strip())
    thinking = completion if end < 0 else completion[:end]
    # (value, offset where the thinking wrote it) per kept step
    kept = [(value, start) for value, start, _ in _kept_values(thinking)]
    final = completion[end:] if end >= 0 else ""
    if grade(final, str(truth[-1])):  # the run's own grading: the reward and the culprit agree
        return None
    written = [int(m.group(4)) for m in _EQUATION.finditer(final)]
    wrong = next((i for i, (v, t) in enumerate(zip(written, truth, strict=False)) if v != t), None)
    if wrong is not None:
        if wrong < len(kept) and kept[wrong][0] == written[wrong]:
            return "thinking", kept[wrong][1]
        return "answer", end
    first = next((at for (v, at), t in zip(kept, truth, strict=False) if v != t), None)
    if first is not None and not written:
        return "thinking", first
    return ("answer", end) if end >= 0 else None


def culprit_offset(row: Mapping[str, Any], completion: str) -> int | None:
    """Where a completion of ``row["problem"]`` first goes wrong (character offset; None: it is
    right): the knowledge behind the ``oracle`` credit method (``RREDCoTTrainer(culprit=...)``)."""
    problem = row.get("problem")
    if parse_problem(problem) is None:
        raise ValueError(
            f"oracle credit needs the synthetic task, whose every step can be checked; row "
            f"{row.get('id')!r} has problem {problem!r}"
        )
    found = culprit(problem, completion)
    return None if found is None else found[1]


def _kept_values(thinking: str) -> list[tuple[int, int, int]]:
    """(value, character offset where it starts, offset just past it) of each step the thinking keeps,
    in order: a line's ``= value`` is one step, a ``Wait`` line revises the step before it."""
    kept: list[tuple[int, int, int]] = []
    offset = 0
    for line in thinking.split("\n"):
        match = _EQUATION.search(line)
        if match is not None:
            entry = (int(match.group(4)), offset + match.start(4), offset + match.end(4))
            if line.lstrip().startswith("Wait") and kept:
                kept[-1] = entry  # a revision of the step just written
            else:
                kept.append(entry)
        offset += len(line) + 1
    return kept


def step_errors(problem: str, completion: str) -> tuple[int, int]:
    """(slips, steps) of a completion's thinking: each kept step whose value is not the step applied to
    the value kept before it (the start for the first). A slip is judged locally, so a step computed
    right from a wrong value counts as right: this is the rate at which the writer slips, not the
    share of wrong values. (0, 0) for a problem that is not synthetic."""
    parsed = parse_problem(problem)
    if parsed is None:
        return 0, 0
    start, steps, modulus = parsed
    end = completion.find(THINK_END.strip())
    kept = _kept_values(completion if end < 0 else completion[:end])[: len(steps)]
    slips, value = 0, start
    for (written, _, _), (op, operand) in zip(kept, steps, strict=False):
        slips += written != apply_op(value, op, operand, modulus)
        value = written
    return slips, len(kept)


def chain_value(value: int, steps: Sequence[Step], answer: int, modulus: int, slip_rate: float) -> float:
    """Probability that a chain standing at ``value`` ends at ``answer`` after ``steps``, when each step
    is computed right with probability ``1 - slip_rate`` and otherwise lands on any other residue alike.

    Exact, by carrying the distribution of the running value through the steps: a wrong value is not
    always lost (``times 5`` sends half of the residues mod 10 to the same one), which this counts."""
    if not 0.0 <= slip_rate <= 1.0:
        raise ValueError(f"slip rate must lie in [0, 1], got {slip_rate}")
    dist = [0.0] * modulus
    dist[value % modulus] = 1.0
    other = slip_rate / (modulus - 1) if modulus > 1 else 0.0
    for op, operand in steps:
        nxt = [0.0] * modulus
        for residue, p in enumerate(dist):
            if p == 0.0:
                continue
            right = apply_op(residue, op, operand, modulus)
            for target in range(modulus):
                nxt[target] += p * ((1.0 - slip_rate) if target == right else other)
        dist = nxt
    return dist[answer % modulus]


def exact_values(problem: str, completion: str, offsets: Sequence[int], slip_rate: float) -> list[float]:
    """The value of a completion at each character offset (an exit point): the probability that its
    final answer comes out right when, from there on, every step not yet kept by the thinking is
    computed (in more thinking or in the final solution) with ``slip_rate`` (``chain_value``) and the
    final solution copies the kept values faithfully.

    The state at an offset is the last value the thinking kept before it (the start when none) and the
    steps left after it, which the task knows exactly; no sampling is involved. At the model's own exit
    with every step kept, the value is 1 for a right last value and 0 for a wrong one (up to the slips
    that remain), so the final solution's own slips are the answer segment's."""
    parsed = parse_problem(problem)
    if parsed is None:
        raise ValueError(
            f"exact values need the synthetic task, whose every step can be checked; got {problem!r}"
        )
    start, steps, modulus = parsed
    answer = run_chain(start, steps, modulus)[-1]
    end = completion.find(THINK_END.strip())
    kept = _kept_values(completion if end < 0 else completion[:end])[: len(steps)]
    values = []
    for offset in offsets:
        done = [v for v, _, at in kept if at <= offset]
        value = done[-1] if done else start
        values.append(chain_value(value, steps[len(done) :], answer, modulus, slip_rate))
    return values


def batch_slip_rate(problems: Sequence[str], completions: Sequence[str]) -> float:
    """The slip rate of a batch of completions: its slips over its kept steps (``step_errors``), with
    one slip and one right step added (Laplace's rule), so the rate stays inside (0, 1) and follows the
    policy as training lowers its slips."""
    counts = [step_errors(p, c) for p, c in zip(problems, completions, strict=True)]
    return (sum(c[0] for c in counts) + 1) / (sum(c[1] for c in counts) + 2)


def exact_value_functions(
    rows: Sequence[Mapping[str, Any]], completions: Sequence[str]
) -> list[Callable[[Sequence[int]], list[float]]]:
    """Per completion of a batch (``rows[i]["problem"]``, ``completions[i]``), the function from
    character offsets to its ``exact_values`` at the batch's own slip rate (``batch_slip_rate``): the
    knowledge behind the ``exact`` credit method (``RREDCoTTrainer(task_values=...)``)."""
    problems = [str(row.get("problem")) for row in rows]
    for row, problem in zip(rows, problems, strict=True):
        if parse_problem(problem) is None:
            raise ValueError(
                f"exact credit needs the synthetic task, whose every step can be checked; row "
                f"{row.get('id')!r} has problem {problem!r}"
            )
    rate = batch_slip_rate(problems, completions)
    return [
        functools.partial(lambda p, c, offsets: exact_values(p, c, offsets, rate), p, c)
        for p, c in zip(problems, completions, strict=True)
    ]
