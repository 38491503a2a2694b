"""Tests of the credit views (rredcot.viz.credit_view): HTML and PNG rendering of one trace's credit."""

from __future__ import annotations

import copy
import html
import json
import math
import re
import struct
from pathlib import Path
from typing import Any

import pytest

from rredcot.infra.io import read_jsonl
from rredcot.viz.credit_view import (
    credit_hex,
    layout_text,
    render_html,
    render_png,
    validate_record,
    write_views,
)

# A short arithmetic trace whose third line is wrong (17 * 4 is 68, not 58); one segment per line.
LINES = [
    "We need 17 * 24 for <b> & co.\n",
    "17 * 20 = 340.\n",
    "17 * 4 = 58.\n",
    "So 340 + 58 = 398.\n",
    "\\boxed{398}",
]
TOKEN_RE = re.compile(r"\n|[ ]?[A-Za-z]+|[ ]?\d|[ ]?[^\sA-Za-z\d]")


def _tokenise(lines: list[str]) -> tuple[list[str], list[int]]:
    """Token texts and the index of each line's first token (the segment starts)."""
    tokens: list[str] = []
    starts: list[int] = []
    for line in lines:
        starts.append(len(tokens))
        tokens += TOKEN_RE.findall(line)
    assert "".join(tokens) == "".join(lines)
    return tokens, starts


def make_record(lines: list[str] = LINES, hot_segment: int = 2, nll: bool = True) -> dict[str, Any]:
    """A realistic credit record: σ concentrated on ``hot_segment``, log v̂ dropping at the wrong step."""
    tokens, starts = _tokenise(lines)
    n, k = len(tokens), len(starts)
    seg = [max(i for i, b in enumerate(starts) if b <= t) for t in range(n)]
    weight = [6.0 if s == hot_segment else 0.4 for s in seg]
    total = sum(weight)
    cuts = starts + [n]
    log_values: list[float | None] = [
        -2.0 + 0.3 * j - (3.0 if j > hot_segment else 0.0) for j in range(k + 1)
    ]
    log_values[-1] = None  # v̂ = 0 at the final exit point
    record: dict[str, Any] = {
        "trace_id": "gsm8k-17x24-s3",
        "step": 120,
        "method": "rredcot",
        "prompt": "What is 17 * 24? Answer in \\boxed{}. <i>$5 & more</i>",
        "answer": "408",
        "reward": 0.0,
        "advantage": -0.75,
        "tokens": tokens,
        "sigma": [w / total for w in weight],
        "segment_starts": starts,
        "cuts": cuts,
        "log_values": log_values,
        "entropies": [0.5 + 0.1 * (t % 7) for t in range(n)],
    }
    if nll:
        record["thought_nll"] = [2.0 * j for j in range(k + 1)]
        record["answer_nll"] = [None if v is None else -v for v in log_values]
    return record


def _token_spans(page: str) -> list[tuple[str, str]]:
    """(style, inner HTML) of every token span, in document order."""
    return re.findall(r"<span class='tok' style='([^']*)' title='[^']*'>(.*?)</span>", page, flags=re.S)


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


# --------------------------------------------------------------------------------------------------
# HTML
# --------------------------------------------------------------------------------------------------


def test_html_contains_every_token_escaped_in_order() -> None:
    record = make_record()
    page = render_html(record)
    spans = _token_spans(page)
    assert [inner for _, inner in spans] == [html.escape(t) for t in record["tokens"]]
    assert html.unescape("".join(inner for _, inner in spans)) == "".join(LINES)


def test_html_escapes_special_characters() -> None:
    page = render_html(make_record())
    assert "<b>" not in page and "<i>" not in page
    assert "&lt;b&gt;" in page and "&amp;" in page
    assert "&lt;i&gt;$5 &amp; more&lt;/i&gt;" in page  # the prompt
    assert "gsm8k-17x24-s3" in page and "rredcot" in page and "408" in page


def test_html_colours_high_sigma_segment_differently() -> None:
    record = make_record()
    spans = _token_spans(render_html(record))
    starts, n = record["segment_starts"], len(record["tokens"])
    hot = set(range(starts[2], starts[3]))
    hot_styles = {spans[t][0] for t in hot}
    cold_styles = {spans[t][0] for t in range(n) if t not in hot}
    assert hot_styles.isdisjoint(cold_styles)
    uniform = credit_hex(1.0)
    assert uniform.lower() == "#ffffff"
    assert all(uniform not in style for style in hot_styles | cold_styles)
    # Above uniform is red-ish (red channel dominates), below is blue-ish.
    (hot_style,) = hot_styles
    colour = re.search(r"#([0-9a-f]{6})", hot_style).group(1)
    assert int(colour[:2], 16) > int(colour[4:], 16)


def test_html_shows_the_greedy_solution_the_answer_was_judged_against() -> None:
    record = make_record()
    assert "greedy solution at the exit" not in render_html(record)
    record["answer_baseline"] = "7 + 4 = <3>"
    page = render_html(record)
    assert "greedy solution at the exit" in page and "7 + 4 = &lt;3&gt;" in page


def test_uniform_sigma_is_white() -> None:
    record = make_record()
    n = len(record["tokens"])
    record["sigma"] = [1.0 / n] * n
    styles = {style for style, _ in _token_spans(render_html(record))}
    assert styles == {"background:#ffffff"}


def test_html_marks_boundaries_shares_and_chart() -> None:
    record = make_record()
    page = render_html(record)
    markers = re.findall(r"<span class='seg' title='[^']*'>(\d+) · (\d+)%</span>", page)
    assert [int(k) for k, _ in markers] == list(range(len(record["segment_starts"])))
    assert sum(int(p) for _, p in markers) == pytest.approx(100, abs=len(markers))
    # The chart: one inline SVG (matplotlib's, the PNG's values panel), a marker per exit point and
    # series, its legend as text, nothing fetched from elsewhere.
    assert page.count("<svg") == 1
    svg = page[page.index("<svg") : page.index("</svg>")]
    assert "log v̂" in svg and "thought NLL" in svg and "answer NLL" in svg
    namespaces = ("http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink")
    links = page
    for ns in namespaces:
        links = links.replace(ns, "")
    assert "<script" not in page and "http://" not in links and "https://" not in links


def test_values_chart_plots_every_exit_point() -> None:
    """The chart of both views: log v̂ at every cut (a gap where it is -inf), NLLs on a twin axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rredcot.viz.credit_png import plot_values

    record = make_record()
    fig, ax = plt.subplots()
    try:
        plot_values(ax, record)
        (values,) = [line for line in ax.get_lines() if line.get_label() == "log v̂"]
        assert list(values.get_xdata()) == record["cuts"]
        y = values.get_ydata()
        for got, want in zip(y, record["log_values"], strict=True):
            assert (want is None and got != got) or got == pytest.approx(want)
        (twin,) = [a for a in fig.axes if a is not ax]
        assert [line.get_label() for line in twin.get_lines()] == ["thought NLL", "answer NLL"]
    finally:
        plt.close(fig)


def test_html_without_optional_fields() -> None:
    record = make_record(nll=False)
    del record["entropies"]
    page = render_html(record)
    assert "thought NLL" not in page and "entropy" not in page
    assert len(_token_spans(page)) == len(record["tokens"])


# --------------------------------------------------------------------------------------------------
# PNG
# --------------------------------------------------------------------------------------------------


def test_png_is_written_and_grows_with_lines(tmp_path: Path) -> None:
    short = render_png(make_record(), tmp_path / "short.png")
    long_lines = LINES[:-1] * 12 + LINES[-1:]
    long = render_png(make_record(long_lines, hot_segment=30), tmp_path / "long.png")
    (w1, h1), (w2, h2) = _png_size(short), _png_size(long)
    assert w1 == w2
    assert h2 > h1 + 200
    assert not list(tmp_path.glob(".*tmp*"))


def test_layout_wraps_and_breaks_lines() -> None:
    tokens = ["a" * 8, " bb", "\n", "c" * 25]
    layout = layout_text(tokens, [0, 2], wrap=10)
    # line 0: |aaaaaaaa   line 1: " bb|↵" (" bb" does not fit after the a's)   lines 2-4: the c's
    assert layout.n_lines == 5
    assert layout.boundaries == [(0, 0, 0), (1, 1, 3)]
    assert [(c.line, c.col, c.newline) for c in layout.cells if c.token == 2] == [(1, 4, True)]
    assert [c.text for c in layout.cells if c.token == 3] == ["c" * 10, "c" * 10, "c" * 5]
    assert all(c.col + len(c.text) <= 10 for c in layout.cells)


# --------------------------------------------------------------------------------------------------
# Batch output
# --------------------------------------------------------------------------------------------------


def test_write_views_writes_files_and_jsonl_round_trips(tmp_path: Path) -> None:
    records = [make_record(), make_record(hot_segment=0, nll=False)]
    paths = write_views(records, tmp_path / "views", stem="ex")
    names = sorted(p.name for p in paths)
    assert names == sorted(["ex_0.html", "ex_0.png", "ex_1.html", "ex_1.png", "exs.jsonl"])
    assert all(p.is_file() and p.stat().st_size > 0 for p in paths)
    assert sorted(p.name for p in (tmp_path / "views").iterdir()) == names
    assert read_jsonl(tmp_path / "views" / "exs.jsonl") == json.loads(json.dumps(records))


def test_write_views_validates_before_writing(tmp_path: Path) -> None:
    bad = make_record()
    bad["sigma"] = bad["sigma"][:-1]
    with pytest.raises(ValueError, match=r"record 1: 'sigma'"):
        write_views([make_record(), bad], tmp_path / "views")
    assert not (tmp_path / "views").exists()


# --------------------------------------------------------------------------------------------------
# Validation and edge cases
# --------------------------------------------------------------------------------------------------


def _broken(field: str, value: Any) -> dict[str, Any]:
    record = copy.deepcopy(make_record())
    if value is _DELETE:
        del record[field]
    else:
        record[field] = value
    return record


_DELETE = object()
_N = len(_tokenise(LINES)[0])


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tokens", _DELETE),
        ("tokens", "not a list"),
        ("sigma", [1.0 / (_N - 1)] * (_N - 1)),
        ("sigma", [-0.1] + [1.1 / (_N - 1)] * (_N - 1)),
        ("sigma", [math.nan] * _N),
        ("sigma", [0.5 / _N] * _N),
        ("segment_starts", [1, 5]),
        ("segment_starts", [0, 9, 5]),
        ("segment_starts", [0, _N]),
        ("cuts", [0, 5, _N + 1]),
        ("cuts", [-1, 5]),
        ("log_values", [0.0]),
        ("log_values", [math.nan] * 6),
        ("log_values", [-math.inf] * 6),
        ("thought_nll", [1.0, 2.0]),
        ("entropies", [1.0]),
        ("reward", math.nan),
        ("advantage", "big"),
        ("step", 1.5),
        ("trace_id", 7),
        ("answer_baseline", 3),
    ],
)
def test_bad_records_raise_naming_the_field(field: str, value: Any) -> None:
    record = _broken(field, value)
    with pytest.raises(ValueError, match=f"'{field}'"):
        validate_record(record)
    with pytest.raises(ValueError, match=f"'{field}'"):
        render_html(record)


def test_empty_trace_renders(tmp_path: Path) -> None:
    record = make_record()
    record.update(tokens=[], sigma=[], segment_starts=[], cuts=[0], log_values=[-1.5], entropies=[])
    record.update(thought_nll=[0.0], answer_nll=[1.5])
    page = render_html(record)
    assert "(empty completion)" in page and not _token_spans(page) and "<svg" in page
    assert _png_size(render_png(record, tmp_path / "empty.png"))[1] > 0
    record.update(cuts=[], log_values=[], thought_nll=None, answer_nll=None)
    assert "no exit points" in render_html(record)
    render_png(record, tmp_path / "empty2.png")
    with pytest.raises(ValueError, match="'segment_starts'"):
        validate_record({**record, "segment_starts": [0]})


# --------------------------------------------------------------------------------------------------
# Traces with nothing to redistribute
# --------------------------------------------------------------------------------------------------

NOTHING = "nothing to redistribute"


def _png_text(path: Path) -> str:
    """The title lines a PNG view keeps in its text chunks."""
    from PIL import Image

    with Image.open(path) as image:
        return "\n".join(str(v) for v in image.text.values())


def test_one_segment_pictures_say_there_is_nothing_to_redistribute(tmp_path: Path) -> None:
    single = make_record(["".join(LINES)], hot_segment=0)
    assert len(single["segment_starts"]) == 1
    assert len(set(single["sigma"])) == 1  # σ uniform, as the methods give one segment
    several = make_record()
    assert NOTHING in html.unescape(render_html(single))
    assert "one segment" in html.unescape(render_html(single))
    assert NOTHING not in html.unescape(render_html(several))
    assert NOTHING in _png_text(render_png(single, tmp_path / "single.png"))
    assert NOTHING not in _png_text(render_png(several, tmp_path / "several.png"))
    assert "σ is uniform" not in _png_text(tmp_path / "several.png")


def _uniform(record: dict[str, Any], **fields: Any) -> dict[str, Any]:
    n = len(record["tokens"])
    return {**record, "sigma": [1.0 / n] * n, **fields}


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"method": "uniform"}, "uniform credit (GRPO)"),
        ({"advantage": 0.0}, "advantage 0: nothing to redistribute"),
        ({"mix": 0.0, "segment_rewards": [0.0, 0.0, -0.9, 0.1, 0.0]}, "mix 0"),
        ({"segment_rewards": [0.0] * 5}, "all segment rewards are 0"),
        ({"segment_rewards": [0.1, 0.0, 0.3, 0.0, 0.2]}, "no segment lowered the value"),
        ({"advantage": 0.5, "segment_rewards": [-0.1, 0.0, -0.3, 0.0, 0.0]}, "no segment raised the value"),
        ({"segment_rewards": None, "entropies": [0.0] * _N}, "every token's entropy is 0"),
        ({"segment_rewards": [0.0, 0.0, -0.9, 0.1, 0.0]}, "σ is uniform: no credit was redistributed"),
    ],
)
def test_uniform_sigma_is_explained(fields: dict[str, Any], words: str) -> None:
    """Each case in which the methods give every token 1/|o| names itself; a record that moved credit
    names none, whatever its fields."""
    from rredcot.viz.credit_record import uniform_reason

    record = _uniform(make_record(), **fields)
    validate_record(record)
    assert words in uniform_reason(record)
    assert words in html.unescape(render_html(record))
    assert uniform_reason({**make_record(), **fields}) is None


def test_bad_segment_rewards_and_mix_raise() -> None:
    for field, value in [("segment_rewards", [math.nan]), ("segment_rewards", 1.0), ("mix", 1.5)]:
        with pytest.raises(ValueError, match=f"'{field}'"):
            validate_record({**make_record(), field: value})


def _credit(n: int, starts: list[int], rewards: list[float], advantage: float):  # noqa: ANN202
    """A trace's credit as the rredcot method computes it from its segment rewards."""
    import torch

    from rredcot.method.assign import TraceCredit
    from rredcot.method.registry import credit_multiplier
    from rredcot.method.segmentation import segment_ids_from_starts

    r = torch.tensor(rewards, dtype=torch.float64)
    ids = segment_ids_from_starts(starts, n)
    multiplier = credit_multiplier("rredcot", n, advantage, 0.5, ids, r)
    log_values = torch.cat([torch.zeros(1, dtype=torch.float64), r.cumsum(0)])[: len(starts) + 1]
    cuts = [*starts, n][: len(log_values)]
    entropies = torch.linspace(0.5, 2.0, n)
    return TraceCredit(multiplier, starts, cuts, log_values, entropies=entropies, segment_rewards=r)


def _kept_views(advantages: list[float], credits: list[Any], view_samples: int = 2) -> list[dict[str, Any]]:
    """The records the trainer's ``_keep_views`` keeps of one batch (a row per trace) at step 10."""
    from types import SimpleNamespace

    import torch

    from rredcot.adapter.trainer import RREDCoTTrainer
    from rredcot.method.settings import CreditConfig

    trainer = SimpleNamespace(
        credit=CreditConfig(method="rredcot", view_every=10, view_samples=view_samples),
        state=SimpleNamespace(global_step=10),
        credit_views=[],
        assigner=SimpleNamespace(
            token_texts=lambda ids: [f" t{t}" for t in ids], baseline_text=lambda tc: None
        ),
    )
    n = len(advantages)
    inputs = [{"prompt": f"problem {j}", "answer": str(j)} for j in range(n)]
    completions = [list(range(tc.multiplier.numel())) for tc in credits]
    RREDCoTTrainer._keep_views(
        trainer, inputs, list(range(n)), completions, torch.tensor(advantages), credits
    )
    return trainer.credit_views


def test_kept_views_prefer_traces_with_several_segments() -> None:
    one_neg, one_pos = _credit(6, [0], [-2.0], -1.0), _credit(6, [0], [0.0], 1.0)
    three_neg = _credit(12, [0, 4, 8], [0.0, -1.0, 0.0], -1.0)
    two_pos = _credit(8, [0, 4], [0.5, 0.0], 1.0)
    views = _kept_views([-1.0, 1.0, -1.0, 1.0], [one_neg, one_pos, three_neg, two_pos])
    # The alternation of signs stands (negative first); within a sign the trace with segments wins.
    assert [(v["trace_id"], v["advantage"] < 0) for v in views] == [("step10-2", True), ("step10-3", False)]
    assert [len(v["segment_starts"]) for v in views] == [3, 2]
    assert all(NOTHING not in html.unescape(render_html(v)) for v in views)
    assert views[0]["mix"] == 0.5 and views[0]["segment_rewards"] == [0.0, -1.0, 0.0]


def test_kept_views_fall_back_to_one_segment_only_when_a_sign_has_no_other() -> None:
    one_neg = _credit(6, [0], [-2.0], -1.0)
    two_pos = [_credit(8, [0, 4], [0.5, 0.0], 1.0), _credit(8, [0, 2], [0.0, 0.5], 1.0)]
    views = _kept_views([1.0, -1.0, 1.0], [two_pos[0], one_neg, two_pos[1]], view_samples=3)
    assert [v["trace_id"] for v in views] == ["step10-1", "step10-0", "step10-2"]
    # The one-segment trace's σ is uniform, and its pictures say why.
    assert set(views[0]["sigma"]) == {1 / 6}
    assert "one segment: nothing to redistribute" in html.unescape(render_html(views[0]))
