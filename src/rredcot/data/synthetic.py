"""Deterministic generator of the synthetic multi-step reasoning task (modular arithmetic chains).

A problem such as ``"Start at 7, add 5, times 3, minus 4. Work mod 10."`` has ``level`` operations.
Each row carries a reference solution, a noisy teacher trace for SFT warm-up, and truth columns, in
the common record schema shared with the real math datasets. Only the ``rl`` split gets label noise,
so the label-error cleaner can be scored against the injected truth.

Run ``python -m rredcot.data.synthetic --out-dir DIR`` to write ``DIR/{sft,rl,test}.jsonl``.
"""

from __future__ import annotations

import argparse
import functools
import random
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from rredcot.data.grading import grade
from rredcot.infra.io import write_jsonl

OP_WORDS = {"+": "add", "-": "minus", "*": "times"}
NOISE_KINDS = ("wrong_answer", "inconsistent_solution", "missing_solution", "consistent_wrong_label")
SPLITS = ("sft", "rl", "test")
MIDDLE_KEYWORDS = ("Next, ", "Then, ", "Now, ", "So, ")
THINK_END = "</think>\n"

Step = tuple[str, int]


@dataclass
class TaskConfig:
    """The synthetic multi-step arithmetic task; the defaults are the default config's (CPU scale)."""

    modulus: int = 10
    """All arithmetic is done modulo this number; answers are residues ``0..modulus-1``."""
    levels: list[int] = field(default_factory=lambda: [2, 3, 4, 5])
    """Difficulty levels = number of operations; every split is spread evenly over them."""
    ops: list[str] = field(default_factory=lambda: ["+", "-", "*"])
    """Operations to draw from (a subset of ``+``, ``-``, ``*``)."""
    teacher_error_rate: float = 0.15
    """Probability that the teacher writes a wrong result in a step. The warmed-up model imitates
    these mistakes when it samples, so RL has something to remove, and a wrong trace has a step to
    blame."""
    teacher_misconceptions: float = 0.0
    """Fraction of the task's facts (``value op operand``) that the teacher holds a fixed wrong
    result for (drawn once from ``seed``). Unlike the random slips of ``teacher_error_rate``, these
    mistakes are systematic: the warmed-up model believes them too, and RL has to unlearn each one
    on its own (``config/misconceptions.yaml``; docs/testbed.md, "The synthetic task")."""
    misconception_rate: float = 0.5
    """Probability that the teacher writes its wrong result when a step is one of its misconceived
    facts (else the step is written like any other)."""
    teacher_fix_rate: float = 0.0
    """Probability that a wrong teacher step is followed by a ``Wait,`` correction line. 0: mistakes
    stand, and the teacher's solution copies its thinking, so a wrong step is where the trace goes
    wrong."""
    teacher_early_exit_rate: float = 0.2
    """Probability that the teacher stops thinking after a random number of steps (possibly none) and
    computes the remaining steps directly in the solution, so that the model itself sometimes exits
    early when it samples (writing the solution from every exit point is what ``sft_exit_rows``
    teaches). Kept low: a mistake in a step computed in the solution is blamed on the whole answer
    segment, so the more steps the solution computes, the less any segment-level credit can
    localise."""
    solution_slip_rate: float = 0.0
    """Probability that the teacher's final solution, copying a value of its thinking, writes a wrong
    one instead. From there on the solution computes every step from its own previous result (same
    error rate), ignoring the thinking lines that started from another value. 0: the solution
    copies the thinking throughout. Meant to teach the model that a solution which has left its
    thinking works on by itself, so that the reference solution at an exit after a wrong line is
    not read as disagreeing with every later line as well (which moves blame past the first wrong
    step). Off by default: a rate high enough to move blame kept SFT from converging
    (docs/testbed.md, "The synthetic task")."""
    sft_exit_rows: float = 0.25
    """Fraction of the SFT split's rows that start at an exit point: the prompt holds the first j
    thinking lines of a teacher trace (j uniform over 0..level) and the exit string, the completion
    is the final solution alone (the remaining steps computed in it, same error rate). SFT trains on
    the completion only, so these rows teach the model to write the solution from any exit point,
    which is what an exit point's value asks of it, without teaching it to stop thinking early when
    it samples (that is ``teacher_early_exit_rate``'s part). The row's ``given`` field holds the
    thinking and exit string that go into the prompt."""
    restate_value: bool = False
    """Each thinking line restates the value its step starts from (``Next, 1 * 4 = 4.``). Without it
    a line holds the step alone (``Next, * 4 = 4.``): the value after a step is then written in
    that step's line only, so a model that copies it into its final solution must read that line
    (with it, it can read the value from the next line's start, one line late, and the blame of a
    wrong step lands one segment late)."""
    n_sft: int = 4000
    """Rows in the SFT warm-up split."""
    n_rl: int = 1000
    """Rows in the RL split (the only split with label noise)."""
    n_test: int = 400
    """Rows in the held-out test split."""
    label_noise: float = 0.15
    """Fraction of RL rows whose label gets corrupted."""
    noise_kinds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(NOISE_KINDS, 1.0))
    """Relative weights of the label-noise kinds."""
    seed: int = 0
    """Seed for everything; the same seed and config give byte-identical rows."""

    def __post_init__(self) -> None:
        if self.modulus < 2:
            raise ValueError("modulus must be at least 2")
        if not self.levels or min(self.levels) < 1:
            raise ValueError("levels must be a non-empty list of positive step counts")
        if not self.ops or set(self.ops) - set(OP_WORDS):
            raise ValueError(f"ops must be a non-empty subset of {sorted(OP_WORDS)}")
        if set(self.noise_kinds) - set(NOISE_KINDS) or sum(self.noise_kinds.values()) <= 0:
            raise ValueError(f"noise_kinds must give positive total weight to kinds among {NOISE_KINDS}")
        if any(weight < 0 for weight in self.noise_kinds.values()):
            raise ValueError(f"noise_kinds: weights must not be negative, got {self.noise_kinds}")
        for name in (
            "teacher_error_rate",
            "teacher_misconceptions",
            "misconception_rate",
            "teacher_fix_rate",
            "teacher_early_exit_rate",
            "solution_slip_rate",
            "sft_exit_rows",
            "label_noise",
        ):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        for name in ("n_sft", "n_rl", "n_test"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)}")


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


def _wrong_residue(rng: random.Random, correct: int, modulus: int) -> int:
    """Uniformly random residue different from ``correct``."""
    wrong = rng.randrange(modulus - 1)
    return wrong + 1 if wrong >= correct else wrong


def misconceptions(cfg: TaskConfig) -> Mapping[tuple[int, str, int], int]:
    """The teacher's misconceived facts: ``(value, op, operand) -> wrong result``, a fixed
    ``teacher_misconceptions`` share of all facts, drawn from their own random stream of ``seed``."""
    return _misconceptions(cfg.seed, cfg.modulus, tuple(sorted(set(cfg.ops))), cfg.teacher_misconceptions)


@functools.cache  # every teacher trace asks; the draw depends on these four settings only
def _misconceptions(
    seed: int, modulus: int, ops: tuple[str, ...], share: float
) -> Mapping[tuple[int, str, int], int]:
    facts = [(v, op, x) for v in range(modulus) for op in ops for x in range(1, modulus)]
    rng = random.Random(f"{seed}-misconceptions")
    chosen = sorted(rng.sample(facts, round(share * len(facts))))
    return MappingProxyType({fact: _wrong_residue(rng, apply_op(*fact, modulus), modulus) for fact in chosen})


def teacher_step(
    value: int,
    op: str,
    operand: int,
    cfg: TaskConfig,
    rng: random.Random,
    wrong: Mapping[tuple[int, str, int], int],
) -> int:
    """The result the teacher writes for one step: its misconception of the fact (``wrong``, at
    ``misconception_rate``), else a random slip (``teacher_error_rate``), else the right result."""
    correct = apply_op(value, op, operand, cfg.modulus)
    believed = wrong.get((value, op, operand))
    if believed is not None and rng.random() < cfg.misconception_rate:
        return believed
    return _wrong_residue(rng, correct, cfg.modulus) if rng.random() < cfg.teacher_error_rate else correct


def teacher_trace(
    start: int, steps: Sequence[Step], cfg: TaskConfig, rng: random.Random, think_steps: int | None = None
) -> tuple[str, int]:
    """Write a teacher completion with occasional (sometimes corrected) mistakes.

    Returns the completion and the final value it boxes. The solution line after ``</think>`` is
    built from the equations the trace kept, so an uncorrected mistake propagates to the answer.
    ``think_steps`` fixes how many steps the thinking computes before the exit; None: all of them,
    or with probability ``teacher_early_exit_rate`` a random number of them.
    """
    lines, kept, value = [], [], start
    wrong = misconceptions(cfg) if cfg.teacher_misconceptions > 0 else {}
    if think_steps is None:
        think_steps = len(steps)
        if rng.random() < cfg.teacher_early_exit_rate:
            think_steps = rng.randrange(len(steps))
    for i, (op, operand) in enumerate(steps):
        if i >= think_steps:
            # Computed directly in the solution line: same error rate, no chance to correct it.
            value = teacher_step(value, op, operand, cfg, rng, wrong)
            kept.append(value)
            continue
        if i == 0:
            keyword = "First, "
        elif i == len(steps) - 1:
            keyword = "Finally, "
        else:
            keyword = rng.choice(MIDDLE_KEYWORDS)
        correct = apply_op(value, op, operand, cfg.modulus)
        result = teacher_step(value, op, operand, cfg, rng, wrong)
        left = f"{value} " if cfg.restate_value else ""
        lines.append(f"{keyword}{left}{op} {operand} = {result}.\n")
        if result != correct and rng.random() < cfg.teacher_fix_rate:
            result = correct
            lines.append(f"Wait, {left}{op} {operand} = {result}.\n")
        kept.append(result)
        value = result
    if cfg.solution_slip_rate > 0:  # no draw at 0: configs without slips keep their exact rows
        kept = _solution_results(start, steps, kept, min(think_steps, len(steps)), cfg, rng, wrong)
        value = kept[-1]
    return "".join(lines) + THINK_END + solution_text(start, steps, kept), value


def _solution_results(
    start: int,
    steps: Sequence[Step],
    kept: Sequence[int],
    think_steps: int,
    cfg: TaskConfig,
    rng: random.Random,
    wrong: Mapping[tuple[int, str, int], int],
) -> list[int]:
    """The results the final solution writes. ``kept`` holds the thinking's results for its first
    ``think_steps`` steps and, past them, the steps the solution computes from them. The solution
    copies the thinking until it slips (``solution_slip_rate``), then computes every step from its
    own previous result."""
    written, value, departed = [], start, False
    for i, (op, operand) in enumerate(steps):
        if departed:
            value = teacher_step(value, op, operand, cfg, rng, wrong)
        else:
            value = kept[i]
            if i < think_steps and rng.random() < cfg.solution_slip_rate:
                value, departed = _wrong_residue(rng, value, cfg.modulus), True
        written.append(value)
    return written


def _sample_problems(
    n: int, cfg: TaskConfig, rng: random.Random, seen: set[str]
) -> list[tuple[int, list[Step], str]]:
    """Draw ``n`` problems not in ``seen`` (updated in place), cycling through the levels."""
    problems = []
    for i in range(n):
        level = cfg.levels[i % len(cfg.levels)]
        while True:
            start = rng.randrange(cfg.modulus)
            steps = [(rng.choice(cfg.ops), rng.randrange(1, cfg.modulus)) for _ in range(level)]
            text = problem_text(start, steps, cfg.modulus)
            if text not in seen:
                break
        seen.add(text)
        problems.append((start, steps, text))
    return problems


def _apportion(total: int, weights: dict[str, float]) -> dict[str, int]:
    """Split ``total`` into integer counts proportional to ``weights`` (largest remainder)."""
    norm = sum(weights.values())
    shares = {kind: total * w / norm for kind, w in weights.items()}
    counts = {kind: int(share) for kind, share in shares.items()}
    by_remainder = sorted(weights, key=lambda kind: (counts[kind] - shares[kind], NOISE_KINDS.index(kind)))
    for kind in by_remainder[: total - sum(counts.values())]:
        counts[kind] += 1
    return counts


def noise_counts(cfg: TaskConfig) -> dict[str, int]:
    """Exact number of RL rows per noise kind; they sum to ``round(label_noise * n_rl)``."""
    return _apportion(round(cfg.label_noise * cfg.n_rl), cfg.noise_kinds)


def _corrupted_results(row: dict[str, Any], modulus: int, rng: random.Random) -> list[int]:
    """Step results with one wrong step propagated to the end, always changing the final value."""
    start, steps = row["start"], [tuple(s) for s in row["steps"]]
    truth = run_chain(start, steps, modulus)
    # Propagation can cancel the error (e.g. a later "times 5" mod 10), which would make the noise
    # invisible in the labels; retry, and fall back to corrupting the last step, which always shows.
    for _ in range(10):
        k = rng.randrange(len(steps))
        values = truth[:k] + [_wrong_residue(rng, truth[k], modulus)]
        for op, operand in steps[k + 1 :]:
            values.append(apply_op(values[-1], op, operand, modulus))
        if values[-1] != truth[-1]:
            return values
    return truth[:-1] + [_wrong_residue(rng, truth[-1], modulus)]


def _inject_noise(row: dict[str, Any], kind: str, modulus: int, rng: random.Random, occurrence: int) -> None:
    """Corrupt ``row``'s answer / solution in place; ``occurrence`` counts earlier rows of ``kind``."""
    row["noise"] = kind
    if kind == "wrong_answer":
        row["answer"] = str(_wrong_residue(rng, int(row["true_answer"]), modulus))
    elif kind == "missing_solution":
        # Both encodings of "no solution" occur in real data; alternate so both are exercised.
        row["solution"] = None if occurrence % 2 == 0 else ""
    else:
        results = _corrupted_results(row, modulus, rng)
        row["solution"] = solution_text(row["start"], [tuple(s) for s in row["steps"]], results)
        if kind == "consistent_wrong_label":
            row["answer"] = str(results[-1])


def _make_split(split: str, n: int, cfg: TaskConfig, seen: set[str]) -> list[dict[str, Any]]:
    # Separate random streams per split and purpose: the test set does not change when n_sft
    # changes, and the problems do not change when only the teacher's error rates change.
    problem_rng = random.Random(f"{cfg.seed}-{split}-problems")
    teacher_rng = random.Random(f"{cfg.seed}-{split}-teacher")
    exit_rng = random.Random(f"{cfg.seed}-{split}-exits")
    # The SFT split's last rows start at an exit point (TaskConfig.sft_exit_rows).
    first_exit_row = n - round(cfg.sft_exit_rows * n) if split == "sft" else n
    rows = []
    for i, (start, steps, text) in enumerate(_sample_problems(n, cfg, problem_rng, seen)):
        answer = str(run_chain(start, steps, cfg.modulus)[-1])
        solution = solution_text(start, steps, run_chain(start, steps, cfg.modulus))
        given = ""
        if i < first_exit_row:
            completion, final = teacher_trace(start, steps, cfg, teacher_rng)
        else:
            trace, final = teacher_trace(start, steps, cfg, exit_rng, exit_rng.randrange(len(steps) + 1))
            cut = trace.index(THINK_END) + len(THINK_END)
            given, completion = trace[:cut], trace[cut:]
        rows.append(
            {
                "id": f"syn-{split}-{i:06d}",
                "problem": text,
                "answer": answer,
                "solution": solution,
                "source": "synthetic",
                "level": len(steps),
                "split": split,
                "completion": completion,
                **({"given": given} if given else {}),
                "completion_correct": str(final) == answer,
                "start": start,
                "steps": [[op, operand] for op, operand in steps],
                "true_answer": answer,
                "true_solution": solution,
                "noise": None,
            }
        )
    return rows


def _check_capacity(cfg: TaskConfig, sizes: Iterable[int]) -> None:
    """Rejection sampling of unseen problems only terminates if enough distinct problems exist."""
    needed = Counter(cfg.levels[i % len(cfg.levels)] for n in sizes for i in range(n))
    for level, count in needed.items():
        if count > cfg.modulus * (len(set(cfg.ops)) * (cfg.modulus - 1)) ** level:
            raise ValueError(f"not enough distinct level-{level} problems for the requested split sizes")


def study_split(cfg: TaskConfig, n: int) -> list[dict[str, Any]]:
    """``n`` fresh problems that only the analyses read (split ``study``, ids ``syn-study-…``), spread
    over the levels as every split is, disjoint by problem text from the ``sft``, ``rl`` and ``test``
    splits. Those stay exactly as :func:`generate_splits` makes them: the study split is drawn after
    them, from random streams of its own."""
    _check_capacity(cfg, (cfg.n_sft, cfg.n_rl, cfg.n_test, n))
    seen = {row["problem"] for rows in generate_splits(cfg).values() for row in rows}
    return _make_split("study", n, cfg, seen)


def generate_splits(cfg: TaskConfig) -> dict[str, list[dict[str, Any]]]:
    """Generate the ``sft``, ``rl`` and ``test`` splits, disjoint by problem text.

    Label noise goes into exactly ``round(label_noise * n_rl)`` RL rows, with per-kind counts from
    :func:`noise_counts`.
    """
    sizes = {"sft": cfg.n_sft, "rl": cfg.n_rl, "test": cfg.n_test}
    _check_capacity(cfg, sizes.values())
    seen: set[str] = set()
    # Test first, then rl, then sft: earlier splits never depend on the sizes of later ones.
    splits = {split: _make_split(split, sizes[split], cfg, seen) for split in ("test", "rl", "sft")}
    noise_rng = random.Random(f"{cfg.seed}-rl-noise")
    kinds = [kind for kind, count in noise_counts(cfg).items() for _ in range(count)]
    noisy = sorted(noise_rng.sample(range(cfg.n_rl), len(kinds)))
    noise_rng.shuffle(kinds)
    seen_kinds: Counter[str] = Counter()
    for row_index, kind in zip(noisy, kinds, strict=True):
        _inject_noise(splits["rl"][row_index], kind, cfg.modulus, noise_rng, seen_kinds[kind])
        seen_kinds[kind] += 1
    return {split: splits[split] for split in SPLITS}


def summarize(splits: dict[str, list[dict[str, Any]]]) -> str:
    """Human-readable summary: rows per split and level, teacher accuracy, label-noise counts."""
    lines = []
    for split, rows in splits.items():
        levels = Counter(row["level"] for row in rows)
        per_level = ", ".join(f"L{level}: {count}" for level, count in sorted(levels.items()))
        correct = sum(row["completion_correct"] for row in rows) / max(len(rows), 1)
        exits = sum("given" in row for row in rows)
        line = f"{split}: {len(rows)} rows ({per_level}); teacher traces correct: {correct:.1%}"
        lines.append(line + (f"; {exits} start at an exit point" if exits else ""))
    noise = Counter(row["noise"] for rows in splits.values() for row in rows if row["noise"])
    lines.append("label noise: " + (", ".join(f"{k}={v}" for k, v in sorted(noise.items())) or "none"))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """CLI: write ``sft.jsonl``, ``rl.jsonl`` and ``test.jsonl`` to ``--out-dir`` and print a summary."""
    defaults = TaskConfig()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", required=True, type=Path)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--modulus", type=int, default=defaults.modulus)
    parser.add_argument("--levels", type=int, nargs="+", default=defaults.levels)
    parser.add_argument("--ops", nargs="+", default=defaults.ops, choices=sorted(OP_WORDS))
    parser.add_argument("--teacher-error-rate", type=float, default=defaults.teacher_error_rate)
    parser.add_argument("--teacher-misconceptions", type=float, default=defaults.teacher_misconceptions)
    parser.add_argument("--misconception-rate", type=float, default=defaults.misconception_rate)
    parser.add_argument("--teacher-fix-rate", type=float, default=defaults.teacher_fix_rate)
    parser.add_argument("--teacher-early-exit-rate", type=float, default=defaults.teacher_early_exit_rate)
    parser.add_argument("--sft-exit-rows", type=float, default=defaults.sft_exit_rows)
    parser.add_argument(
        "--restate-value",
        action=argparse.BooleanOptionalAction,
        default=defaults.restate_value,
        help="thinking lines restate the value their step starts from (--no-restate-value: the step alone)",
    )
    parser.add_argument("--n-sft", type=int, default=defaults.n_sft)
    parser.add_argument("--n-rl", type=int, default=defaults.n_rl)
    parser.add_argument("--n-test", type=int, default=defaults.n_test)
    parser.add_argument("--label-noise", type=float, default=defaults.label_noise)
    args = parser.parse_args(argv)
    cfg = TaskConfig(
        modulus=args.modulus,
        levels=args.levels,
        ops=args.ops,
        teacher_error_rate=args.teacher_error_rate,
        teacher_misconceptions=args.teacher_misconceptions,
        misconception_rate=args.misconception_rate,
        teacher_fix_rate=args.teacher_fix_rate,
        teacher_early_exit_rate=args.teacher_early_exit_rate,
        sft_exit_rows=args.sft_exit_rows,
        restate_value=args.restate_value,
        n_sft=args.n_sft,
        n_rl=args.n_rl,
        n_test=args.n_test,
        label_noise=args.label_noise,
        seed=args.seed,
    )
    splits = generate_splits(cfg)
    for split, rows in splits.items():
        write_jsonl(args.out_dir / f"{split}.jsonl", rows)
    print(summarize(splits))


if __name__ == "__main__":
    main()
