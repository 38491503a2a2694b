"""Deterministic generator of the synthetic task's splits (modular arithmetic chains).

Each row carries a reference solution, a noisy teacher trace for SFT warm-up, and truth columns, in
the common record schema shared with the real math datasets. Only the ``rl`` split gets label noise,
so the label-error cleaner can be scored against the injected truth. ``rredcot data`` writes the
splits of a config (``rredcot.stages.data``).
"""

from __future__ import annotations

import functools
import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from rredcot.data.synthetic.grammar import (
    OP_WORDS,
    THINK_END,
    Step,
    apply_op,
    problem_text,
    run_chain,
    solution_text,
)

NOISE_KINDS = ("wrong_answer", "inconsistent_solution", "missing_solution", "consistent_wrong_label")
SPLITS = ("sft", "rl", "test")
MIDDLE_KEYWORDS = ("Next, ", "Then, ", "Now, ", "So, ")


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
    step). Off by default: a rate high enough to move blame keeps the default model's SFT from converging
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
