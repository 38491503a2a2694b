"""Tests for the label-error cleaner (and the atomic JSONL writers it relies on)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rredcot.data.cleaning import (
    REASONS,
    CleanSettings,
    check_row,
    clean_rows,
    count_solution_steps,
    final_answer,
    format_table,
    jaccard,
    majority_resolver,
    mark_redundancy,
    near_text,
    shingles,
)
from rredcot.data.cleaning.dedup import NearIndex, Sketcher
from rredcot.data.synthetic import NOISE_KINDS, TaskConfig, generate_splits
from rredcot.infra.io import atomic_path, read_jsonl, write_json, write_jsonl
from rredcot.lm.resolve import model_resolver
from rredcot.stages.clean import clean_file as main

# Samples of the public benchmarks (provenance: tests/fixtures/README.md).
DATA_DIR = Path(__file__).parent / "fixtures" / "data"
EVAL_SETS = ("math500", "aime24", "aime25", "amc23")
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
        {"id": "syn-x-2", "flagged": True, "reasons": ["duplicate"], "duplicate_of": "syn-x-1"},
    ]
    assert report["reasons"]["duplicate"] == 1


def test_count_solution_steps() -> None:
    assert count_solution_steps(SYN_ROW["solution"]) == 3
    assert count_solution_steps("$n \\equiv 4 \\cdot 6 \\equiv 24 \\equiv \\boxed{3} \\pmod 7$.") == 3
    assert count_solution_steps("The value is 3.5, so the answer is $\\boxed{3.5}$.") == 1
    assert count_solution_steps("First line.\nSecond line with x <= 3.") == 2
    assert count_solution_steps("\\boxed{2}") == 0


def test_real_reference_labels_are_mostly_clean() -> None:
    _, flags, report = clean_rows(read_jsonl(DATA_DIR / "math500.jsonl"))
    # Measured on the whole set: 14/500 flagged, all as one-step solutions (not_stepwise). The sample
    # keeps two of them.
    assert [flag["id"] for flag in flags if flag["flagged"]] == [
        "test/algebra/187.json",
        "test/prealgebra/1747.json",
    ]
    assert report["reasons"]["not_stepwise"] == 2 and report["flagged_fraction"] == pytest.approx(0.04)
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


# --- real-data extensions: final answers, switches, near duplicates, eval overlap, robust input ---


def _load(name: str) -> list[dict]:
    return read_jsonl(DATA_DIR / f"{name}.jsonl")


@pytest.mark.parametrize(
    ("solution", "expected"),
    [
        ("so $\\boxed{5}$, and checking again gives \\fbox{6}.", "6"),
        ("$\\frac{9}{3} + 0.4 = 3.4$ hours, or $\\framebox{204}$ minutes", "204"),
        ("Hence the answer is $\\frac{1}{2}$.", "\\frac{1}{2}"),
        ("The final answer is 501.", "501"),
        ("So the answer is: \\(x^2\\)", "x^2"),
        ("The answer is therefore large.", None),
        ("An unbalanced \\boxed{5 at the end", None),
        ("No final answer stated.", None),
        (None, None),
    ],
)
def test_final_answer_forms(solution: str | None, expected: str | None) -> None:
    assert final_answer(solution) == expected


def test_aops_answer_decoration_is_not_a_mismatch() -> None:
    row = {
        **REAL_ROW,
        "answer": "73",
        "solution": "Adding, $x = 73$. Then $y = 0$.\n$\\boxed{\\textbf{(073)}}$",
    }
    assert check_row(row) == []
    assert check_row({**row, "answer": "74"}) == ["solution_answer_mismatch"]
    # No stated final answer: nothing to compare, so no mismatch (but still step-by-step).
    assert check_row({**row, "solution": "First $x = 73$.\nThen $y = 0$."}) == []


def test_require_solution_switch_is_reported(capsys) -> None:
    rows = [
        {**REAL_ROW, "solution": None},
        {**REAL_ROW, "id": "real-2", "problem": "Other.", "solution": None},
    ]
    assert check_row(rows[0], settings=CleanSettings(require_solution=False)) == []
    _, flags, report = clean_rows(rows, settings=CleanSettings(require_solution=False))
    assert not any(flag["flagged"] for flag in flags)
    assert report["checks"]["missing_solution"].startswith("OFF")
    assert report["rows_without_solution"] == 2
    table = format_table(report)
    assert "missing_solution          OFF (clean.require_solution is false)" in table
    assert "rows without a solution: 2" in table
    _, _, default = clean_rows(rows)
    assert default["reasons"]["missing_solution"] == 2 and default["checks"]["missing_solution"] == "on"


def test_near_duplicates_need_similar_text_numbers_and_answer() -> None:
    base = (
        "A bag has 4 red and 6 blue marbles. Two marbles are drawn at random without replacement. "
        "What is the probability that both are red? Express your answer as a common fraction."
    )
    copy = base.replace("4 red and 6 blue", "$4$ red and $6$  blue").replace("fraction.", "fraction")
    variant = base.replace("both are red", "both are blue")  # other answer
    renumbered = base.replace("6 blue", "11 blue")  # other numbers, yet the same answer 2/15
    rows = [
        {"id": "a", "problem": base, "answer": "\\frac{2}{15}"},
        {"id": "b", "problem": copy, "answer": "2/15"},
        {"id": "c", "problem": variant, "answer": "\\frac{1}{3}"},
        {"id": "d", "problem": renumbered, "answer": "\\frac{2}{15}"},
    ]
    ids = ["a", "b", "c", "d"]
    assert jaccard(shingles(base, 5), shingles(copy, 5)) == 1.0
    assert all(0.85 <= jaccard(shingles(base, 5), shingles(t, 5)) < 1.0 for t in (variant, renumbered))
    marks = mark_redundancy(rows, ids, CleanSettings(), [])
    assert marks == [
        {"reasons": []},
        {"reasons": ["near_duplicate"], "duplicate_of": "a"},
        *[{"reasons": []}] * 2,
    ]
    loose = mark_redundancy(rows, ids, CleanSettings(near_duplicate_strict=False), [])
    assert loose[2:] == [{"reasons": ["near_duplicate"], "duplicate_of": "a"}] * 2
    # The same guards apply to overlap with evaluation problems.
    overlap = mark_redundancy(rows[1:], ids[1:], CleanSettings(), rows[:1])
    assert [mark.get("eval_match") for mark in overlap] == ["a", None, None]
    # Operators stay significant; formatting does not.
    assert near_text("Let $0 < p < 15$.") == near_text("Let $0<p<15.$") != near_text("Let $0 > p > 15$.")


def test_lsh_finds_the_same_near_pairs_as_brute_force(rl_rows: list[dict]) -> None:
    texts = [row["problem"] for row in rl_rows[:400]]
    defaults = CleanSettings()
    hasher, threshold = Sketcher(defaults.shingle_size, defaults.minhash_permutations), 0.5
    sketches = [hasher.sketch(text) for text in texts]
    brute = {
        j
        for j in range(len(texts))
        if any(jaccard(sketches[i][0], sketches[j][0]) >= threshold for i in range(j) if texts[i] != texts[j])
    }
    index, found = NearIndex(threshold, hasher.num_perm), set()
    for j, sketch in enumerate(sketches):
        if index.best_match(sketch) is not None:
            found.add(j)
        index.add(j, sketch)
    assert len(brute) > 100  # the synthetic templates give many near pairs at 0.5
    assert found == brute


def test_majority_resolver_needs_most_samples_to_disagree() -> None:
    samples = {
        "two of three wrong": ["3", "3", "2"],
        "one of three wrong": ["3", "2", "2"],
        "no answers": [None, None, None],
        "half wrong": ["3", "3", None, None],
        "all wrong": ["3", "4", "4"],
    }
    resolver = majority_resolver(lambda row: samples[row["problem"]])
    verdicts = {
        problem: check_row({**REAL_ROW, "problem": problem, "answer": "2"}, resolvers=[resolver])
        for problem in samples
    }
    assert verdicts == {
        "two of three wrong": ["solution_answer_mismatch", "resolve_mismatch"],
        "one of three wrong": ["solution_answer_mismatch"],
        "no answers": ["solution_answer_mismatch"],
        "half wrong": ["solution_answer_mismatch"],
        "all wrong": ["solution_answer_mismatch", "resolve_mismatch"],
    }
    assert resolver({"problem": "all wrong", "answer": "2"}) == "4"


@pytest.mark.slow
def test_model_resolver_runs_a_local_model(tmp_path: Path) -> None:
    from rredcot.lm.modeling import build_scratch_model, train_tokenizer

    tokenizer = train_tokenizer(["Problem: what is 1+1? \\boxed{2}"] * 20, 300)
    sizes = {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1}
    model = build_scratch_model(
        tokenizer, {**sizes, "intermediate_size": 32, "max_position_embeddings": 64}, 0
    )
    tokenizer.save_pretrained(tmp_path)
    model.save_pretrained(tmp_path)
    resolver = model_resolver(tmp_path, k=3, max_new_tokens=4, prompt_template="Problem: {problem}\n")
    # An untrained model states no boxed answer: no evidence against the label.
    assert resolver({"problem": "what is 1+1?", "answer": "2"}) == "2"


def test_report_breaks_down_by_source_and_level() -> None:
    rows = [
        {**REAL_ROW, "id": "a", "source": "s1", "difficulty": 2.25},
        {**REAL_ROW, "id": "b", "problem": "Another.", "answer": "x=", "source": "s1", "difficulty": 4.5},
        {**REAL_ROW, "id": "c", "problem": "Third.", "solution": None, "source": "s2"},
    ]
    _, _, report = clean_rows(rows, settings=CleanSettings(level_field="difficulty"))
    assert report["by_source"] == {
        "s1": {"rows": 2, "flagged": 1, "fraction": 0.5, "reasons": {"unparseable_answer": 1}},
        "s2": {"rows": 1, "flagged": 1, "fraction": 1.0, "reasons": {"missing_solution": 1}},
    }
    # Float difficulties are grouped by rounding half up; rows without the field are "<none>".
    assert list(report["by_level"]) == ["2", "5", "<none>"]
    assert report["flagged_fraction_by_level"] == {"2": 0.0, "5": 1.0}
    table = format_table(report).splitlines()
    assert "s2            1        1    100.0%  missing_solution=1" in table


def test_real_eval_overlap_and_solution_answers() -> None:
    """AIME training problems against the evaluation sets, with their AoPS solutions checked too."""
    rows = _load("deepscaler_aime_train")
    evals = [row for name in EVAL_SETS for row in _load(name)]
    _, flags, report = clean_rows(rows, eval_rows=evals)
    overlaps = {flag["id"]: flag["eval_match"] for flag in flags if "eval_overlap" in flag["reasons"]}
    # The known word-for-word copy, plus seven near copies (punctuation, LaTeX spacing, a reworded
    # clause), all with the same numbers and answer; measured at the default threshold 0.75.
    assert overlaps["aime-2017-2-7-786"] == "test/intermediate_algebra/1849.json"
    assert overlaps["aime-2006-2-5-454"] == "test/counting_and_probability/1003.json"  # Jaccard 0.80
    assert len(overlaps) == 8 and all(match.startswith("test/") for match in overlaps.values())
    # Every AoPS solution's last box (\boxed, \framebox, \textbf{(051)}) agrees with its label.
    assert report["reasons"]["solution_answer_mismatch"] == 0
    assert report["reasons"]["unparseable_answer"] == 0
    assert report["checks"]["eval_overlap"].startswith("on (115 problems")


def test_real_solution_answer_mismatch_is_detected() -> None:
    rows = _load("math500")
    wrong = [
        {**row, "answer": other["answer"]}
        for row, other in zip(rows, rows[1:] + rows[:1], strict=True)
        if not check_row({**row, "answer": other["answer"]}, resolvers=[]) == []
    ]
    assert len(wrong) >= 45  # a few neighbours share the answer
    assert all("solution_answer_mismatch" in check_row(row, resolvers=[]) for row in wrong)
    loose = CleanSettings(min_solution_steps=0)
    assert all(check_row(row, resolvers=[], settings=loose) == [] for row in _load("aime24"))


def test_real_duplicates_in_math_train() -> None:
    rows = _load("math_train")
    evals = [row for name in EVAL_SETS for row in _load(name)]
    marks = mark_redundancy(rows, [row["id"] for row in rows], CleanSettings(), evals)
    found = {row["id"]: mark for row, mark in zip(rows, marks, strict=True) if mark["reasons"]}
    assert found["math-train-957"] == {"reasons": ["duplicate"], "duplicate_of": "math-train-923"}
    # "Evaluate $\log_82$." vs "$\log_8 2$." (answers \frac13 and \frac{1}{3}).
    assert found["math-train-1224"] == {"reasons": ["near_duplicate"], "duplicate_of": "math-train-1165"}
    # Same text but for LaTeX display and spacing; labels \mathbf{2340} and 2340.
    assert found["math-train-4310"]["duplicate_of"] == "math-train-3482"
    # Measured: 1 exact and 10 near duplicates (8 reformatted copies, 2 variants with equal numbers
    # and answers: "f(f(x))" vs "f(f(f(x)))", "PROOF" vs "RADII"), and no overlap with the evaluation
    # sets once numbers and answers must agree.
    assert sum("near_duplicate" in mark["reasons"] for mark in found.values()) == 10
    assert not any("eval_overlap" in mark["reasons"] for mark in found.values())


BAD_LINES = [
    (json.dumps({**REAL_ROW, "id": "ok-1"}).encode(), []),
    (b'{"id": "cut", "problem": ', ["malformed_json"]),
    (b"[1, 2, 3]", ["not_an_object"]),
    (b'"just a string"', ["not_an_object"]),
    (b"   ", ["blank_line"]),
    (json.dumps({"id": "no-problem", "answer": "1"}).encode(), ["missing_field:problem"]),
    (json.dumps({"problem": "No id here.", "answer": "1"}).encode(), ["missing_field:id"]),
    (
        json.dumps({"id": "blank", "problem": " ", "answer": ""}).encode(),
        ["empty_field:problem", "empty_field:answer"],
    ),
    (b'{"id": "latin1", "problem": "caf\xe9", "answer": "1"}', ["invalid_utf8"]),
    (json.dumps({**REAL_ROW, "id": "huge", "problem": "x" * 1000}).encode(), ["oversized_field:problem"]),
    (
        json.dumps({**REAL_ROW, "id": "huge-list", "messages": ["a" * 100] * 5}).encode(),
        ["oversized_field:messages"],
    ),
    (json.dumps({**REAL_ROW, "id": 3.5}).encode(), ["wrong_type:id"]),
    (json.dumps({**REAL_ROW, "id": "int-answer", "answer": 42}).encode(), ["wrong_type:answer"]),
    (json.dumps({**REAL_ROW, "id": "list-solution", "solution": ["step"]}).encode(), ["wrong_type:solution"]),
    (b"[" * 100_000, ["malformed_json"]),
    (json.dumps({**REAL_ROW, "id": "ok-2", "problem": "Compute $1-\\frac12$."}).encode() + b"\r", []),
    (json.dumps({**REAL_ROW, "id": "copy"}).encode(), ["duplicate"]),
]


def test_cli_survives_every_kind_of_bad_line(tmp_path: Path, capsys) -> None:
    inp = tmp_path / "bad.jsonl"
    inp.write_bytes(b"\n".join(line for line, _ in BAD_LINES))  # no final newline either
    out, flags_path, report_path = tmp_path / "c.jsonl", tmp_path / "f.jsonl", tmp_path / "r.json"
    argv = [str(inp), "--out", str(out), "--flags", str(flags_path), "--report", str(report_path)]
    main([*argv, "--max-field-chars", "400"])
    flags = read_jsonl(flags_path)
    assert [flag["reasons"] for flag in flags] == [reasons for _, reasons in BAD_LINES]
    ids = [flag["id"] for flag in flags]
    assert ids[:8] == "ok-1 line-2 line-3 line-4 line-5 no-problem line-7 blank".split()
    assert flags[8]["id"] == "latin1" and flags[11]["id"] == "line-12"
    assert flags[-1]["duplicate_of"] == "ok-1"
    assert [row["id"] for row in read_jsonl(out)] == ["ok-1", "ok-2"]
    report = json.loads(report_path.read_text())
    assert report["total"] == len(BAD_LINES) and report["flagged"] == len(BAD_LINES) - 2
    assert report["reasons"]["malformed_json"] == 2 and report["reasons"]["not_an_object"] == 2
    assert report["by_source"]["<unreadable>"]["rows"] == 5
    assert "<unreadable>" in capsys.readouterr().out


def test_cli_with_eval_sets_and_config(tmp_path: Path, capsys) -> None:
    rows = [row for row in _load("deepscaler_aime_train") if row["year"] == 2017]
    inp = tmp_path / "aime2017.jsonl"
    write_jsonl(inp, [{**row, "solution": None} for row in rows])
    override = tmp_path / "override.yaml"
    override.write_text("clean:\n  require_solution: false\n  level_field: difficulty\n")
    config = Path(__file__).parents[1] / "config" / "config.yaml"
    paths = [tmp_path / name for name in ("c.jsonl", "f.jsonl", "r.json")]
    argv = [str(inp), "--out", str(paths[0]), "--flags", str(paths[1]), "--report", str(paths[2])]
    evals = [str(DATA_DIR / f"{name}.jsonl") for name in EVAL_SETS]
    main([*argv, "--config", str(config), str(override), "--eval-sets", *evals])
    flags = {flag["id"]: flag for flag in read_jsonl(paths[1])}
    assert flags["aime-2017-2-7-786"]["reasons"] == ["eval_overlap"]
    assert flags["aime-2017-2-7-786"]["eval_match"] == "test/intermediate_algebra/1849.json"
    assert sum(flag["flagged"] for flag in flags.values()) == 1
    report = json.loads(paths[2].read_text())
    assert report["checks"]["missing_solution"].startswith("OFF") and report["rows_without_solution"] == 30
    assert report["eval_sets"]["problems"] == 115 and set(report["by_level"]) <= {
        "2",
        "3",
        "4",
        "5",
        "6",
        "7",
    }
    printed = capsys.readouterr().out
    assert "missing_solution          OFF" in printed and "eval_overlap=1" in printed
    # A config section handed over by the caller sets the same defaults; flags still win.
    main([*argv, "--require-solution"], settings={"require_solution": False})
    assert json.loads(paths[2].read_text())["reasons"]["missing_solution"] == 30
