"""Where a wrong synthetic trace goes wrong, and how much of its blame that segment gets."""

from __future__ import annotations

import pytest

from rredcot.studies.localisation import culprit, summarise, trace_localisation

PROBLEM = "Start at 5, minus 3, times 9, times 8. Work mod 10."  # 2, 8, 4


def test_culprit_in_the_thinking_is_the_wrong_value_the_solution_copied() -> None:
    text = "First, 5 - 3 = 2.\nNext, 2 * 9 = 7.\nFinally, 7 * 8 = 6.\n</think>\n"
    text += "5 - 3 = 2, 2 * 9 = 7, 7 * 8 = 6. \\boxed{6}"
    where, at = culprit(PROBLEM, text)
    assert where == "thinking" and text[at:].startswith("7.\nFinally, 7 * 8")


def test_a_corrected_slip_is_not_the_culprit_but_a_wrong_correction_is() -> None:
    fixed = "First, 5 - 3 = 1.\nWait, 5 - 3 = 2.\nNext, 2 * 9 = 8.\nFinally, 8 * 8 = 4.\n</think>\n"
    assert culprit(PROBLEM, fixed + "5 - 3 = 2, 2 * 9 = 8, 8 * 8 = 4. \\boxed{4}") is None
    broken = "First, 5 - 3 = 2.\nWait, 5 - 3 = 3.\nNext, 3 * 9 = 7.\n"
    where, at = culprit(PROBLEM, broken + "</think>\n\\boxed{7}")
    assert where == "thinking" and broken[at:].startswith("3.\nNext, 3 * 9")


def test_right_thinking_and_wrong_final_solution_blames_the_answer() -> None:
    text = "First, 5 - 3 = 2.\nNext, 2 * 9 = 8.\nFinally, 8 * 8 = 4.\n</think>\n"
    text += "5 - 3 = 2, 2 * 9 = 8, 8 * 8 = 2. \\boxed{2}"
    where, at = culprit(PROBLEM, text)
    assert where == "answer" and text[at:].startswith("</think>")
    assert culprit("What is 2 + 2?", text) is None  # not a synthetic problem


def _row(rewards: list[float]) -> dict:
    lines = ["First, 5 - 3 = 2.\n", "Next, 2 * 9 = 7.\n", "Finally, 7 * 8 = 6.\n", "</think>\n\\boxed{6}"]
    tokens = [piece for line in lines for piece in (line[:6], line[6:])]  # two tokens per line
    return {
        "trace_id": "t",
        "prompt": f"Problem: {PROBLEM}\n<think>\n",
        "tokens": tokens,
        "correct": False,
        "truncated": False,
        "segment_starts": [0, 2, 4, 6],
        "segment_rewards": rewards,
        "sigma": [1 / len(tokens)] * len(tokens),
    }


def test_blame_share_of_the_culprit_segment() -> None:
    hit = trace_localisation(_row([0.5, -3.0, -1.0, 0.0]))
    assert hit["where"] == "thinking" and hit["segment"] == 1 and hit["segments"] == 4
    assert hit["blame_share"] == pytest.approx(0.75) and hit["top_blame"]
    assert hit["token_share"] == pytest.approx(0.25) and hit["sigma_share"] == pytest.approx(0.25)
    miss = trace_localisation(_row([-2.0, -1.0, 0.0, 0.0]))
    assert miss["blame_share"] == pytest.approx(1 / 3) and not miss["top_blame"]
    assert trace_localisation({**_row([0.0] * 4), "correct": True}) is None
    assert hit["thinking_top_offset"] == 0 and miss["thinking_top_offset"] == -1
    # With an answer segment (the last), the thinking offset looks at the others only.
    late = trace_localisation({**_row([0.0, -1.0, -2.0, -5.0]), "answer_reward": -5.0})
    assert not late["top_blame"] and late["thinking_top_offset"] == 1
    summary = summarise([hit, miss, late])
    assert summary["thinking"]["thinking_top_at_culprit"] == pytest.approx(1 / 3)
    assert summary["thinking"]["thinking_top_one_later"] == pytest.approx(1 / 3)
    summary = summarise([hit, miss])
    assert summary["thinking"]["traces"] == 2 and summary["answer"] == {"traces": 0}
    assert summary["all"]["top_blame_rate"] == pytest.approx(0.5)
    assert summary["all"]["chance"] == pytest.approx(0.25)


def test_a_thinking_error_the_solution_did_not_copy_is_not_the_culprit() -> None:
    # The thinking slips at step 2, the final solution recomputes it correctly and slips at step 3.
    text = "First, 5 - 3 = 2.\nNext, 2 * 9 = 7.\nFinally, 7 * 8 = 6.\n</think>\n"
    where, at = culprit(PROBLEM, text + "5 - 3 = 2, 2 * 9 = 8, 8 * 8 = 1. \\boxed{1}")
    assert where == "answer" and text[at:].startswith("</think>")
    # Without a final solution to read, the first wrong kept value is taken.
    where, at = culprit(PROBLEM, text + "\\boxed{6}")
    assert where == "thinking" and text[at:].startswith("7.\nFinally, 7 * 8")


def test_thinking_lines_that_hold_the_step_alone() -> None:
    # data.synthetic.restate_value false: "* 9 = 7" without the value the step starts from.
    text = "First, - 3 = 2.\nNext, * 9 = 7.\nFinally, * 8 = 6.\n</think>\n"
    where, at = culprit(PROBLEM, text + "5 - 3 = 2, 2 * 9 = 7, 7 * 8 = 6. \\boxed{6}")
    assert where == "thinking" and text[at:].startswith("7.\nFinally, * 8")


def test_pictures_of_wrong_traces_per_culprit_kind(tmp_path) -> None:
    from rredcot.studies.localisation import write_culprit_views

    row = {
        **_row([0.5, -3.0, -1.0, 0.0]),
        "trace_id": "t7",
        "answer": "3",
        "advantage": -1.0,
        "method": "rredcot",
        "cuts": [0, 2, 4, 6],
        "log_values": [-3.0, -2.5, -5.5, -6.5],
        "answer_reward": 0.0,
        "answer_baseline": "5 - 3 = 2, 2 * 9 = 7, 7 * 8 = 6.",
    }
    found = [trace_localisation(row)]
    written = write_culprit_views([row], found, tmp_path / "views", per_kind=2)
    names = sorted(p.name for p in written)
    assert names == ["thinking_0.html", "thinking_0.png", "thinkings.jsonl"]
    assert "greedy solution at the exit" in (tmp_path / "views" / "thinking_0.html").read_text()
    assert write_culprit_views([], [], tmp_path / "empty", per_kind=2) == []
    assert (tmp_path / "empty").is_dir()
