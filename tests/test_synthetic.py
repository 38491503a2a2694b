"""Tests for the synthetic modular-arithmetic task generator."""

from __future__ import annotations

import dataclasses
import json
import random
import re
from collections import Counter

import pytest

from rredcot.data.grading import extract_boxed
from rredcot.data.records import sft_records
from rredcot.data.synthetic import (
    MIDDLE_KEYWORDS,
    NOISE_KINDS,
    SPLITS,
    TaskConfig,
    generate_splits,
    noise_counts,
    problem_text,
    solution_text,
    solve,
    study_split,
    summarize,
    teacher_trace,
)

EXAMPLE_STEPS = [("+", 5), ("*", 3), ("-", 4)]


@pytest.fixture(scope="module")
def cfg() -> TaskConfig:
    # The restating format with corrections (config/restating.yaml) and some early exits: every
    # branch of the teacher.
    return TaskConfig(
        restate_value=True, teacher_error_rate=0.1, teacher_fix_rate=0.5, teacher_early_exit_rate=0.15
    )


@pytest.fixture(scope="module")
def splits(cfg: TaskConfig) -> dict[str, list[dict]]:
    return generate_splits(cfg)


def _all_rows(splits: dict[str, list[dict]]) -> list[dict]:
    return [row for rows in splits.values() for row in rows]


def test_documented_example_formats() -> None:
    assert problem_text(7, EXAMPLE_STEPS, 10) == "Start at 7, add 5, times 3, minus 4. Work mod 10."
    assert solution_text(7, EXAMPLE_STEPS, [2, 6, 2]) == "7 + 5 = 2, 2 * 3 = 6, 6 - 4 = 2. \\boxed{2}"
    teacher = TaskConfig(teacher_error_rate=0.0, restate_value=True, teacher_early_exit_rate=0.0)
    completion, final = teacher_trace(7, EXAMPLE_STEPS, teacher, random.Random(0))
    assert final == 2
    lines = completion.split("\n")
    assert lines[0] == "First, 7 + 5 = 2."
    assert lines[1].startswith(MIDDLE_KEYWORDS) and lines[1].endswith("2 * 3 = 6.")
    assert lines[2:] == ["Finally, 6 - 4 = 2.", "</think>", "7 + 5 = 2, 2 * 3 = 6, 6 - 4 = 2. \\boxed{2}"]


def test_solve_parses_problem_text() -> None:
    assert solve("Start at 7, add 5, times 3, minus 4. Work mod 10.") == "2"
    assert solve("Start at 3, minus 5. Work mod 7.") == "5"
    assert solve("What is 2 + 2?") is None
    assert solve("") is None


def test_same_seed_is_byte_identical_and_other_seed_differs(cfg: TaskConfig, splits: dict) -> None:
    assert json.dumps(generate_splits(cfg)) == json.dumps(splits)
    other = generate_splits(dataclasses.replace(cfg, seed=cfg.seed + 1))
    assert [r["problem"] for r in other["rl"]] != [r["problem"] for r in splits["rl"]]


def test_test_split_does_not_depend_on_sft_size(cfg: TaskConfig, splits: dict) -> None:
    smaller = generate_splits(dataclasses.replace(cfg, n_sft=100))
    assert smaller["test"] == splits["test"]
    assert len(smaller["sft"]) == 100


def test_splits_are_disjoint_without_duplicates(cfg: TaskConfig, splits: dict) -> None:
    assert list(splits) == list(SPLITS)
    assert [len(splits[s]) for s in SPLITS] == [cfg.n_sft, cfg.n_rl, cfg.n_test]
    problems = [row["problem"] for row in _all_rows(splits)]
    assert len(set(problems)) == len(problems)
    ids = [row["id"] for row in _all_rows(splits)]
    assert len(set(ids)) == len(ids)
    assert splits["rl"][123]["id"] == "syn-rl-000123"


def test_levels_present_and_balanced(cfg: TaskConfig, splits: dict) -> None:
    for split, rows in splits.items():
        counts = Counter(row["level"] for row in rows)
        assert sorted(counts) == cfg.levels, split
        assert max(counts.values()) - min(counts.values()) <= 1
        for row in rows:
            assert len(row["steps"]) == row["level"] == row["problem"].count(",")


def test_noise_count_and_kinds_exact(cfg: TaskConfig, splits: dict) -> None:
    noisy = [row for row in splits["rl"] if row["noise"] is not None]
    assert len(noisy) == round(cfg.label_noise * cfg.n_rl) == 150
    assert dict(Counter(row["noise"] for row in noisy)) == noise_counts(cfg)
    assert set(noise_counts(cfg)) == set(NOISE_KINDS)
    assert all(row["noise"] is None for split in ("sft", "test") for row in splits[split])


def test_noise_kinds_corrupt_the_right_fields(splits: dict) -> None:
    missing_forms = set()
    for row in splits["rl"]:
        kind, boxed = row["noise"], extract_boxed(row["solution"] or "")
        if kind is None:
            assert (row["answer"], row["solution"]) == (row["true_answer"], row["true_solution"])
        elif kind == "wrong_answer":
            assert row["answer"] != row["true_answer"] and row["solution"] == row["true_solution"]
        elif kind == "inconsistent_solution":
            assert row["answer"] == row["true_answer"] and boxed != row["answer"]
        elif kind == "missing_solution":
            assert row["answer"] == row["true_answer"] and row["solution"] in (None, "")
            missing_forms.add(row["solution"])
        else:
            assert kind == "consistent_wrong_label"
            assert row["answer"] != row["true_answer"] and boxed == row["answer"]
            assert row["solution"] != row["true_solution"]
    assert missing_forms == {None, ""}


def test_solve_agrees_with_truth_everywhere(splits: dict) -> None:
    for row in _all_rows(splits):
        assert solve(row["problem"]) == row["true_answer"]
        assert extract_boxed(row["true_solution"]) == row["true_answer"]


def test_teacher_completions(cfg: TaskConfig, splits: dict) -> None:
    rows = [row for row in _all_rows(splits) if "given" not in row]
    early = 0
    for row in rows:
        steps_part, solution_line = row["completion"].split("</think>\n")
        lines = steps_part.splitlines()
        step_lines = [line for line in lines if not line.startswith("Wait, ")]
        # The solution always has every step; the thinking may stop early (an early exit).
        assert solution_line.count("=") == row["level"]
        assert len(step_lines) <= row["level"]
        if len(step_lines) < row["level"]:
            early += 1
        else:
            assert step_lines[-1].startswith("Finally, ")
        if step_lines:
            assert step_lines[0].startswith("First, ")
            assert all(line.startswith(MIDDLE_KEYWORDS) for line in step_lines[1:-1])
        assert all(line.endswith(".") for line in lines)
        boxed = extract_boxed(solution_line)
        assert (boxed == row["true_answer"]) == row["completion_correct"]
    # Early exits occur at about the configured rate (a step count drawn below the level).
    assert 0.08 < early / len(rows) < 0.22
    # Teacher mistakes occur, are sometimes fixed, and sometimes reach the final answer.
    assert any("\nWait, " in row["completion"] for row in rows)
    accuracy = sum(row["completion_correct"] for row in rows) / len(rows)
    assert 0.5 < accuracy < 0.85


def test_too_many_problems_for_the_space_is_an_error() -> None:
    with pytest.raises(ValueError, match="distinct"):
        generate_splits(TaskConfig(modulus=2, levels=[1], ops=["+"], n_sft=3, n_rl=0, n_test=0))


def test_the_study_split_is_fresh_and_leaves_the_others_alone(cfg: TaskConfig, splits: dict) -> None:
    """Fresh problems for the PRM study: none in any other split, spread over the levels, and drawing
    them (or more of them) changes no other split and none of its own first rows."""
    study = study_split(cfg, 200)
    assert len(study) == 200 and len({r["problem"] for r in study}) == 200
    assert not {r["problem"] for r in study} & {r["problem"] for r in _all_rows(splits)}
    assert Counter(r["level"] for r in study) == {level: 200 // len(cfg.levels) for level in cfg.levels}
    assert all(r["split"] == "study" and r["id"].startswith("syn-study-") for r in study)
    assert all(solve(r["problem"]) == r["answer"] for r in study)
    assert generate_splits(cfg) == splits
    assert study_split(cfg, 240)[:200] == study
    with pytest.raises(ValueError, match="distinct"):
        study_split(TaskConfig(modulus=3, levels=[1], ops=["+"], n_sft=1, n_rl=1, n_test=1), 4)


def test_summary_counts_rows_and_noise() -> None:
    """The summary ``rredcot data`` logs: rows per split and the label noise injected per kind."""
    cfg = TaskConfig(seed=3, n_sft=40, n_rl=20, n_test=8)
    summary = summarize(generate_splits(cfg))
    assert "rl: 20 rows" in summary
    noise = ", ".join(f"{kind}={n}" for kind, n in sorted(noise_counts(cfg).items()) if n)
    assert summary.endswith(f"label noise: {noise}")


def test_thinking_lines_without_the_starting_value() -> None:
    """restate_value=False: a line holds the step alone, and the solution still copies its result."""
    cfg = TaskConfig(restate_value=False, teacher_error_rate=0.3, teacher_fix_rate=0.5, seed=5)
    rng = random.Random(0)
    steps = [("+", 4), ("*", 4), ("-", 3), ("+", 2)]
    for _ in range(50):
        completion, final = teacher_trace(7, steps, cfg, rng)
        thinking, solution = completion.split("</think>\n")
        kept = []
        for line in thinking.splitlines():
            op_part = line.split(", ", 1)[1]
            assert re.fullmatch(r"[-+*] \d = \d\.", op_part), line  # no starting value
            value = int(op_part[-2])
            if line.startswith("Wait, "):
                kept[-1] = value  # a correction revises the step just written
            else:
                kept.append(value)
        written = [int(v) for v in re.findall(r"= (\d)", solution)]
        assert written[: len(kept)] == kept and written[-1] == final


def test_sft_rows_that_start_at_an_exit_point(cfg: TaskConfig, splits: dict) -> None:
    """The last sft_exit_rows of the SFT split give the thinking up to an exit point in ``given`` and
    keep only the final solution as the completion; every exit point of every level occurs."""
    sft = splits["sft"]
    exits = [row for row in sft if "given" in row]
    assert len(exits) == round(cfg.sft_exit_rows * cfg.n_sft) == 1000
    assert all("given" not in row for row in sft[: cfg.n_sft - len(exits)])
    assert all("given" not in row for split in ("rl", "test") for row in splits[split])
    seen = Counter()
    for row in exits:
        assert row["given"].endswith("</think>\n") and "</think>" not in row["completion"]
        thinking = [line for line in row["given"].splitlines()[:-1] if not line.startswith("Wait, ")]
        seen[row["level"], len(thinking)] += 1
        solution = row["completion"]
        assert solution.count("=") == row["level"]  # the solution computes what the thinking did not
        written = [int(v) for v in re.findall(r"= (\d)", solution)]
        kept = []
        for line in row["given"].splitlines()[:-1]:
            value = int(re.search(r"= (\d)\.$", line).group(1))
            kept = [*kept[:-1], value] if line.startswith("Wait, ") else [*kept, value]
        assert written[: len(kept)] == kept  # ... and copies what it did
        assert (extract_boxed(solution) == row["true_answer"]) == row["completion_correct"]
    assert set(seen) == {(level, j) for level in cfg.levels for j in range(level + 1)}
    # The exit rows use a stream of their own: without them the other SFT rows stay the same.
    fewer = generate_splits(dataclasses.replace(cfg, sft_exit_rows=0.0))
    assert all("given" not in row for row in fewer["sft"])
    assert fewer["sft"][:100] == sft[:100] and fewer["test"] == splits["test"]


def test_sft_records_put_the_given_thinking_in_the_prompt(splits: dict) -> None:
    exit_row = next(row for row in splits["sft"] if "given" in row and row["given"] != "</think>\n")
    plain = splits["sft"][0]
    records = sft_records([plain, exit_row], "Problem: {problem}\n<think>\n", "<eos>")
    assert records[0]["prompt"] == f"Problem: {plain['problem']}\n<think>\n"
    assert records[0]["completion"] == plain["completion"] + "<eos>"
    assert records[1]["prompt"] == f"Problem: {exit_row['problem']}\n<think>\n" + exit_row["given"]
    assert records[1]["completion"] == exit_row["completion"] + "<eos>"


def test_teacher_misconceptions_are_systematic() -> None:
    from rredcot.data.synthetic import apply_op, misconceptions, teacher_step

    cfg = TaskConfig(teacher_misconceptions=0.2, misconception_rate=0.7, teacher_error_rate=0.0)
    wrong = misconceptions(cfg)
    n_facts = 10 * 3 * 9  # value x op x operand (1..9)
    assert len(wrong) == round(0.2 * n_facts)
    assert wrong == misconceptions(cfg)  # fixed by the seed
    assert wrong != misconceptions(dataclasses.replace(cfg, seed=1))
    for (value, op, operand), result in wrong.items():
        assert result != apply_op(value, op, operand, 10) and 0 <= result < 10
    rng = random.Random(0)
    (fact, believed), right = (
        next(iter(wrong.items())),
        next(f for f in ((0, "+", x) for x in range(1, 10)) if f not in wrong),
    )
    written = Counter(teacher_step(*fact, cfg, rng, wrong) for _ in range(2000))
    assert set(written) == {believed, apply_op(*fact, 10)}  # its one wrong belief, or the truth
    assert 0.65 < written[believed] / 2000 < 0.75
    assert {teacher_step(*right, cfg, rng, wrong) for _ in range(200)} == {apply_op(*right, 10)}
    # No misconceptions: the teacher draws exactly what it drew before the option existed.
    base = TaskConfig(n_sft=60, n_rl=20, n_test=20)
    assert generate_splits(base) == generate_splits(dataclasses.replace(base, misconception_rate=0.9))
    rows = generate_splits(dataclasses.replace(base, teacher_misconceptions=0.3, teacher_error_rate=0.0))
    assert any(not row["completion_correct"] for row in rows["sft"])
    with pytest.raises(ValueError, match="teacher_misconceptions"):
        TaskConfig(teacher_misconceptions=1.5)


def test_a_solution_that_slips_works_on_from_its_own_value() -> None:
    """solution_slip_rate: the solution copies the thinking until it slips once, then computes every
    later step from its own previous result; the trace's culprit is then the answer segment."""
    from rredcot.data.synthetic import apply_op, culprit, run_chain

    steps = [("+", 4), ("*", 3), ("-", 3), ("+", 2)]
    cfg = TaskConfig(solution_slip_rate=0.3, teacher_error_rate=0.0, teacher_early_exit_rate=0.5, seed=3)
    rng, slipped = random.Random(0), 0
    for _ in range(200):
        completion, final = teacher_trace(7, steps, cfg, rng)
        thinking, solution = completion.split("</think>\n")
        thought = [int(line[-2]) for line in thinking.splitlines()]
        written = [int(v) for v in re.findall(r"= (\d)", solution)]
        assert written[-1] == final and thought == run_chain(7, steps, 10)[: len(thought)]
        at = next((i for i, (w, t) in enumerate(zip(written, thought, strict=False)) if w != t), None)
        if at is None:  # no slip: the solution is the right chain
            assert written == run_chain(7, steps, 10)
            continue
        slipped += 1
        assert all(written[i] == apply_op(written[i - 1], *steps[i], 10) for i in range(at + 1, len(steps)))
        assert culprit(problem_text(7, steps, 10), completion) == ("answer", completion.index("</think>"))
    assert 40 < slipped < 140
    with pytest.raises(ValueError, match="solution_slip_rate"):
        TaskConfig(solution_slip_rate=-0.1)
