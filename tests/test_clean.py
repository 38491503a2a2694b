"""Tests for the label-error cleaner (and the atomic JSONL writers it relies on)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rredcot.clean import REASONS, check_row, clean_rows, count_solution_steps, main
from rredcot.jsonl import atomic_path, read_jsonl, write_json, write_jsonl
from rredcot.synthetic import NOISE_KINDS, TaskConfig, generate_splits

DATA_DIR = Path(__file__).parents[2] / "shared" / "data"
SYN_ROW = {
    "id": "syn-x-1",
    "problem": "Start at 7, add 5, times 3, minus 4. Work mod 10.",
    "answer": "2",
    "solution": "7 + 5 = 2, 2 * 3 = 6, 6 - 4 = 2. \\boxed{2}",
    "source": "synthetic",
    "level": 3,
}
# A wrong last step whose result is also used as the answer: consistent with itself, but wrong.
CONSISTENT_WRONG = "7 + 5 = 2, 2 * 3 = 6, 6 - 4 = 6. \\boxed{6}"
REAL_ROW = {
    "id": "real-1",
    "problem": "Compute $\\frac{3}{4} - \\frac{1}{4}$.",
    "answer": "\\frac{1}{2}",
    "solution": "We have $\\frac{3}{4} - \\frac{1}{4} = \\frac{2}{4}$.\nSimplifying gives $\\boxed{0.5}$.",
    "source": "handmade",
}


@pytest.fixture(scope="module")
def rl_rows() -> list[dict]:
    return generate_splits(TaskConfig(n_sft=0, n_test=0))["rl"]


@pytest.fixture(scope="module")
def cleaned(rl_rows: list[dict]) -> tuple[list[dict], list[dict], dict]:
    return clean_rows(rl_rows)


def test_flags_match_injected_noise(rl_rows: list[dict], cleaned: tuple) -> None:
    clean, flags, report = cleaned
    noise = report["noise"]
    # Measured: precision = recall = 1.0 on the default rl split (150 noisy rows of 1000).
    assert noise["noisy"] == 150
    assert noise["recall"] >= 0.95 and noise["precision"] >= 0.95
    assert set(noise["recall_by_kind"]) == set(NOISE_KINDS)
    assert all(recall >= 0.95 for recall in noise["recall_by_kind"].values())
    assert all(row["noise"] is None for row in clean)
    assert len(clean) == len(rl_rows) - report["flagged"]


def test_flags_one_row_per_input_in_order(rl_rows: list[dict], cleaned: tuple) -> None:
    clean, flags, _ = cleaned
    assert [flag["id"] for flag in flags] == [row["id"] for row in rl_rows]
    assert all(flag["flagged"] == bool(flag["reasons"]) for flag in flags)
    kept = [row for row, flag in zip(rl_rows, flags, strict=True) if not flag["flagged"]]
    assert clean == kept


def test_report_contents(cleaned: tuple) -> None:
    _, _, report = cleaned
    assert report["total"] == 1000
    assert report["flagged_fraction"] == report["flagged"] / 1000
    assert list(report["reasons"]) == list(REASONS)
    assert set(report["flagged_fraction_by_source"]) == {"synthetic"}
    assert set(report["flagged_fraction_by_level"]) == {"2", "3", "4", "5"}


def test_clean_rows_are_not_flagged() -> None:
    assert check_row(SYN_ROW) == []
    assert check_row(REAL_ROW) == []
    _, flags, report = clean_rows([SYN_ROW, REAL_ROW])
    assert not any(flag["flagged"] for flag in flags)
    assert "noise" not in report


@pytest.mark.parametrize(
    ("row", "reasons"),
    [
        ({**REAL_ROW, "answer": ""}, ["unparseable_answer"]),
        ({**REAL_ROW, "answer": None}, ["unparseable_answer"]),
        ({**REAL_ROW, "solution": None}, ["missing_solution"]),
        ({**REAL_ROW, "solution": "  \n"}, ["missing_solution"]),
        ({**REAL_ROW, "solution": "Clearly $\\boxed{\\frac{1}{2}}$."}, ["not_stepwise"]),
        ({**REAL_ROW, "answer": "\\frac{1}{3}"}, ["solution_answer_mismatch"]),
        # Consistent but wrong label: only the re-solver can tell.
        ({**SYN_ROW, "answer": "6", "solution": CONSISTENT_WRONG}, ["resolve_mismatch"]),
        ({**SYN_ROW, "answer": "3"}, ["solution_answer_mismatch", "resolve_mismatch"]),
    ],
)
def test_each_reason_fires(row: dict, reasons: list[str]) -> None:
    assert check_row(row) == reasons


def test_resolvers_are_pluggable() -> None:
    def says_one_half(row: dict) -> str | None:
        return "1/2" if row["source"] == "handmade" else None

    def says_three(row: dict) -> str | None:
        return "3"

    assert check_row(REAL_ROW, resolvers=[says_one_half]) == []
    assert check_row(REAL_ROW, resolvers=[says_one_half, says_three]) == ["resolve_mismatch"]
    # Without the default synthetic resolver a consistent wrong synthetic label goes unnoticed.
    wrong = {**SYN_ROW, "answer": "6", "solution": CONSISTENT_WRONG}
    assert check_row(wrong, resolvers=[]) == []


def test_duplicates_flag_later_occurrences() -> None:
    copy = {**SYN_ROW, "id": "syn-x-2", "problem": "  start at 7, add 5,  times 3, minus 4. WORK MOD 10."}
    _, flags, report = clean_rows([SYN_ROW, copy])
    assert flags == [
        {"id": "syn-x-1", "flagged": False, "reasons": []},
        {"id": "syn-x-2", "flagged": True, "reasons": ["duplicate"]},
    ]
    assert report["reasons"]["duplicate"] == 1


def test_count_solution_steps() -> None:
    assert count_solution_steps(SYN_ROW["solution"]) == 3
    assert count_solution_steps("$n \\equiv 4 \\cdot 6 \\equiv 24 \\equiv \\boxed{3} \\pmod 7$.") == 3
    assert count_solution_steps("The value is 3.5, so the answer is $\\boxed{3.5}$.") == 1
    assert count_solution_steps("First line.\nSecond line with x <= 3.") == 2
    assert count_solution_steps("\\boxed{2}") == 0


@pytest.mark.skipif(not (DATA_DIR / "math500.jsonl").exists(), reason="shared MATH-500 data not present")
def test_real_reference_labels_are_mostly_clean() -> None:
    _, _, report = clean_rows(read_jsonl(DATA_DIR / "math500.jsonl"))
    # Measured: 14/500 flagged, all as one-step solutions (not_stepwise).
    assert report["flagged_fraction"] < 0.05
    assert report["reasons"]["solution_answer_mismatch"] == 0
    assert report["reasons"]["unparseable_answer"] == 0
    assert set(report["flagged_fraction_by_level"]) == {"1", "2", "3", "4", "5"}


def test_cli_round_trip(tmp_path: Path, rl_rows: list[dict], capsys) -> None:
    rows = rl_rows[:200]
    names = ("in.jsonl", "o/c.jsonl", "f.jsonl", "r.json")
    inp, out, flags_path, report_path = (tmp_path / name for name in names)
    write_jsonl(inp, rows)
    main([str(inp), "--out", str(out), "--flags", str(flags_path), "--report", str(report_path)])
    expected_clean, expected_flags, expected_report = clean_rows(rows)
    assert read_jsonl(out) == expected_clean
    assert read_jsonl(flags_path) == expected_flags
    assert json.loads(report_path.read_text()) == expected_report
    printed = capsys.readouterr().out
    assert f"flagged {expected_report['flagged']}/200" in printed and "precision=" in printed
    # Atomic writes leave no temporary files behind.
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["c.jsonl", "f.jsonl", "in.jsonl", "o", "r.json"]


def test_atomic_path_keeps_target_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "data.jsonl"
    write_jsonl(target, [{"text": "première"}])
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        assert tmp.parent == tmp_path and tmp.name.endswith(".jsonl")
        tmp.write_text("partial")
        raise RuntimeError("interrupted")
    assert read_jsonl(target) == [{"text": "première"}]
    assert [p.name for p in tmp_path.iterdir()] == ["data.jsonl"]
    write_json(tmp_path / "sub" / "obj.json", {"a": [1, 2]})
    assert (tmp_path / "sub" / "obj.json").read_text() == '{\n  "a": [\n    1,\n    2\n  ]\n}\n'
