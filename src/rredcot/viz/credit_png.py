"""The PNG view of a credit record (matplotlib): exit-point values, σ·|o| bars and the coloured text.

Its values panel (:func:`plot_values`) is also the chart of the HTML view, written as SVG by
:func:`values_svg`.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rredcot.infra.io import atomic_path
from rredcot.viz.credit_record import (
    CLIP_LOG2,
    MONO_ADVANCE_EM,
    MONO_FONT,
    STOPS,
    Segment,
    credit_rgb,
    is_dark,
    nll_series,
    record_segments,
    token_ratios,
    uniform_reason,
    validate_record,
)

LOG_VALUE_COLOUR = "#1f4e79"
NLL_COLOURS = ("#d95f02", "#7570b3")
SVG_METADATA = ("Date", "Creator", "Format", "Type")  # left out of the SVG (no dates, no links)


@dataclass(frozen=True)
class TextCell:
    """A run of one token's characters on one text line (``text`` may be the newline marker)."""

    token: int
    line: int
    col: int
    text: str
    newline: bool = False


@dataclass(frozen=True)
class TextLayout:
    """Character-grid placement of the completion for the PNG's text panel."""

    cells: list[TextCell]
    boundaries: list[tuple[int, int, int]]  # (segment, line, column of the bar)
    n_lines: int


def _printable(text: str) -> str:
    """Make a token fit a character grid: tabs become spaces, other control characters a middle dot."""
    text = text.replace("\r\n", "\n").replace("\r", "").replace("\t", "    ")
    return "".join(ch if ch == "\n" or ch.isprintable() else "·" for ch in text)


class _Cursor:
    """Line and column of the next character while laying out the text grid."""

    def __init__(self, wrap: int) -> None:
        self.wrap, self.line, self.col = wrap, 0, 0

    def newline(self) -> None:
        self.line, self.col = self.line + 1, 0

    def room(self) -> int:
        if self.col >= self.wrap:
            self.newline()
        return self.wrap - self.col


def layout_text(tokens: Sequence[str], segment_starts: Sequence[int], wrap: int = 100) -> TextLayout:
    """Lay tokens out on a monospace grid ``wrap`` columns wide.

    Newlines start a new line (drawn as a ↵ cell so newline tokens keep a visible colour), a token
    that does not fit on the current line moves to the next one whole if it fits there, and each
    segment start takes one column for its boundary bar so the bar never covers a glyph.
    """
    cur, cells, boundaries = _Cursor(wrap), [], []
    starts = {b: k for k, b in enumerate(segment_starts)}
    for t, raw in enumerate(tokens):
        text = _printable(raw)
        first = text.split("\n", 1)[0]
        if t in starts:
            cur.room()
            boundaries.append((starts[t], cur.line, cur.col))
            cur.col += 1
        if 0 < len(first) <= wrap and cur.col > 0 and cur.col + len(first) > wrap:
            cur.newline()
        for j, part in enumerate(text.split("\n")):
            if j > 0:
                cur.room()
                cells.append(TextCell(t, cur.line, cur.col, "↵", newline=True))
                cur.newline()
            while part:
                take = part[: cur.room()]
                cells.append(TextCell(t, cur.line, cur.col, take))
                cur.col += len(take)
                part = part[len(take) :]
    return TextLayout(cells, boundaries, cur.line + 1)


@dataclass(frozen=True)
class _PngGeometry:
    """Figure size and panel positions in inches, so the text grid lines up with its font exactly.

    From the top: header (title lines), value panel title, value panel, segment-share labels, σ
    panel, its axis labels, text panel title with the colour legend, text panel.
    """

    font_pt: float
    wrap: int
    n_lines: int
    left: float = 0.9
    right: float = 0.9
    header: float = 0.62
    values_title: float = 0.3
    values_h: float = 2.0
    shares: float = 0.3
    sigma_h: float = 1.5
    sigma_labels: float = 0.5
    text_title: float = 0.55
    bottom: float = 0.15

    @property
    def text_w(self) -> float:
        return self.wrap * self.font_pt * MONO_ADVANCE_EM / 72

    @property
    def row_h(self) -> float:
        return 1.6 * self.font_pt / 72

    @property
    def text_h(self) -> float:
        return self.n_lines * self.row_h + 0.1

    @property
    def width(self) -> float:
        return self.left + self.text_w + self.right

    @property
    def text_y(self) -> float:
        return self.bottom

    @property
    def sigma_y(self) -> float:
        return self.text_y + self.text_h + self.text_title + self.sigma_labels

    @property
    def values_y(self) -> float:
        return self.sigma_y + self.sigma_h + self.shares

    @property
    def height(self) -> float:
        return self.values_y + self.values_h + self.values_title + self.header

    def rect(
        self, bottom: float, height: float, left: float = 0.0, width: float | None = None
    ) -> list[float]:
        """Axes rectangle (figure fractions) at ``bottom`` inches from the foot, spanning the text width."""
        width = self.text_w if width is None else width
        return [
            (self.left + left) / self.width,
            bottom / self.height,
            width / self.width,
            height / self.height,
        ]


def render_png(record: Mapping[str, Any], path: str | Path, *, wrap: int = 100, dpi: int = 120) -> Path:
    """Write a PNG of the trace: exit-point values, σ·|o| bars, and the coloured text; returns the path.

    Written atomically. The figure grows in height with the number of text lines, so traces of
    about 1000 tokens stay legible; the resolution is lowered for very long traces to keep the
    image within what image viewers open.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    validate_record(record)
    layout = layout_text(record["tokens"], record["segment_starts"], wrap)
    reason = uniform_reason(record)
    header = 0.62 if reason is None else 0.84  # a third title line
    geo = _PngGeometry(font_pt=9.5, wrap=wrap, n_lines=layout.n_lines, header=header)
    fig = plt.figure(figsize=(geo.width, geo.height))
    try:
        title = _png_header(fig, geo, record, reason)
        ax_values = fig.add_axes(geo.rect(geo.values_y, geo.values_h))
        ax_sigma = fig.add_axes(geo.rect(geo.sigma_y, geo.sigma_h), sharex=ax_values)
        plot_values(ax_values, record)
        _png_sigma(ax_sigma, record, geo)
        _png_text_title(fig, geo)
        _png_text(fig.add_axes(geo.rect(geo.text_y, geo.text_h)), record, layout, geo)
        out = Path(path)
        with atomic_path(out) as tmp:
            # The title lines go into the file's text chunks too, so they can be read without looking.
            metadata = {"Title": title[0], "Description": "\n".join(title[1:])}
            fig.savefig(
                tmp, format="png", dpi=min(dpi, 30000 / geo.height), facecolor="white", metadata=metadata
            )
    finally:
        plt.close(fig)
    return out


def _png_header(fig: Any, geo: _PngGeometry, record: Mapping[str, Any], reason: str | None) -> list[str]:
    """Title lines: identification, outcome, label answer and prompt, then why σ is uniform when it
    is (``uniform_reason``; the geometry's header leaves room for it). Returns the lines drawn."""
    step = "–" if record["step"] is None else record["step"]
    line1 = (
        f"trace {record['trace_id']}   step {step}   {record['method']}   "
        f"reward {float(record['reward']):.4g}   advantage {float(record['advantage']):+.4g}"
    )
    line2 = f"label: {_one_line(record['answer'], 40)}    prompt: {_one_line(record['prompt'], 100)}"
    x, top = geo.left / geo.width, 1 - 0.1 / geo.height
    fig.text(x, top, line1, fontsize=11, weight="bold", va="top", parse_math=False)
    fig.text(x, top - 0.27 / geo.height, line2, fontsize=8.5, va="top", parse_math=False)
    if reason is None:
        return [line1, line2]
    fig.text(x, top - 0.5 / geo.height, reason, fontsize=9.5, color=STOPS[-1][1], va="top", parse_math=False)
    return [line1, line2, reason]


def _one_line(text: str, limit: int) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _png_text_title(fig: Any, geo: _PngGeometry) -> None:
    """Title of the text panel on the left, the colour legend on the right."""
    y = geo.text_y + geo.text_h + 0.12
    fig.text(
        geo.left / geo.width,
        y / geo.height,
        "completion (background: σ·|o|; black bars: segment boundaries)",
        fontsize=9,
    )
    _png_legend(fig.add_axes(geo.rect(y + 0.08, 0.13, left=geo.text_w - 2.6, width=2.6)))


def _png_legend(ax: Any) -> None:
    """A colour bar of the σ·|o| scale with ticks at powers of two."""
    import numpy as np

    grid = np.linspace(-CLIP_LOG2, CLIP_LOG2, 256)
    ax.imshow([[credit_rgb(2.0**g) for g in grid]], aspect="auto", extent=(-CLIP_LOG2, CLIP_LOG2, 0, 1))
    ticks = list(range(-int(CLIP_LOG2), int(CLIP_LOG2) + 1))
    ax.set_xticks(ticks, [f"1/{2**-e}" if e < 0 else str(2**e) for e in ticks], fontsize=7)
    ax.set_yticks([])
    ax.tick_params(length=2, pad=1)
    ax.set_title("σ·|o| (1 = uniform credit)", fontsize=7.5, pad=2)


def _png_boundaries(ax: Any, record: Mapping[str, Any]) -> None:
    for b in list(record["segment_starts"])[1:]:
        ax.axvline(b, color="0.55", lw=0.7, zorder=1)


def _png_xlim(ax: Any, n_tokens: int) -> None:
    """Token axis with a little room so markers at cut 0 and cut L are not cut in half."""
    pad = 0.012 * max(n_tokens, 1)
    ax.set_xlim(-pad, max(n_tokens, 1) + pad)


def plot_values(ax: Any, record: Mapping[str, Any]) -> None:
    """Top panel: log v̂ per exit point (gaps at -inf), NLL components on a twin axis."""
    cuts, lv = list(record["cuts"]), list(record["log_values"])
    _png_boundaries(ax, record)
    handles = []
    if cuts:
        y = [math.nan if v is None else float(v) for v in lv]
        handles += ax.plot(cuts, y, "o-", color=LOG_VALUE_COLOUR, lw=1.8, ms=4, label="log v̂", zorder=3)
        inf_cuts = [c for c, v in zip(cuts, lv, strict=True) if v is None]
        if inf_cuts:
            trans = ax.get_xaxis_transform()
            ax.plot(
                inf_cuts,
                [0.05] * len(inf_cuts),
                "v",
                mfc="white",
                color=LOG_VALUE_COLOUR,
                ms=7,
                transform=trans,
                clip_on=False,
                zorder=4,
            )
    else:
        ax.text(0.5, 0.5, "no exit points", transform=ax.transAxes, ha="center", color="0.5")
    ax.set_ylabel("log v̂", color=LOG_VALUE_COLOUR)
    _png_xlim(ax, len(record["tokens"]))
    ax.tick_params(labelbottom=False)
    ax.grid(axis="y", color="0.92")
    series = nll_series(record)
    if series and cuts:
        twin = ax.twinx()
        for (label, values), colour in zip(series, NLL_COLOURS, strict=False):
            y = [math.nan if v is None else float(v) for v in values]
            handles += twin.plot(cuts, y, "s--", color=colour, lw=1.2, ms=3, label=label)
        twin.set_ylabel("NLL (nats)")
    if handles:
        ax.legend(
            handles=handles,
            loc="lower right",
            bbox_to_anchor=(1.0, 1.0),
            fontsize=7.5,
            ncols=len(handles),
            frameon=False,
            borderaxespad=0.2,
        )
    ax.set_title("exit-point values at each cut  (▽: log v̂ = −∞)", fontsize=9, loc="left")


def _png_sigma(ax: Any, record: Mapping[str, Any], geo: _PngGeometry) -> None:
    """Middle panel: σ·|o| per token as bars in the colour scale, with each segment's credit share."""
    ratios = token_ratios(record)
    n = len(ratios)
    if n:
        ax.bar(range(n), ratios, width=1.0, align="edge", color=[credit_rgb(r) for r in ratios], lw=0)
        ax.stairs(ratios, range(n + 1), color="0.3", lw=0.6)
    ax.axhline(1.0, color="0.45", lw=0.8, ls=":")
    _png_boundaries(ax, record)
    _png_xlim(ax, n)
    trans = ax.get_xaxis_transform()
    for seg in _share_labels(record_segments(record), max(n, 1), geo.text_w):
        ax.text(
            (seg.start + seg.end) / 2,
            1.02,
            f"{seg.index}: {seg.share:.0%}",
            transform=trans,
            ha="center",
            va="bottom",
            fontsize=7,
            color="0.2",
        )
    ax.set_ylim(0, max([1.5, *ratios]) * 1.08)
    ax.set_ylabel("σ·|o|")
    ax.set_xlabel(
        "token index   (dotted: uniform credit; above: segment: credit share, largest first where crowded)",
        fontsize=8,
    )


def _share_labels(segments: list[Segment], n_tokens: int, width_in: float) -> list[Segment]:
    """The segments whose share label fits above the σ panel, placed greedily by decreasing share."""
    placed: list[tuple[float, float]] = []
    chosen = []
    for seg in sorted(segments, key=lambda s: -s.share):
        centre = (seg.start + seg.end) / 2 / n_tokens * width_in
        half = (len(f"{seg.index}: {seg.share:.0%}") * 7 * 0.62 / 72) / 2 + 0.04
        if all(centre + half <= lo or centre - half >= hi for lo, hi in placed):
            placed.append((centre - half, centre + half))
            chosen.append(seg)
    return chosen


def _png_text(ax: Any, record: Mapping[str, Any], layout: TextLayout, geo: _PngGeometry) -> None:
    """Bottom panel: the completion on a monospace grid, each token on its σ·|o| colour."""
    from matplotlib.collections import LineCollection, PatchCollection
    from matplotlib.patches import Rectangle

    ratios = token_ratios(record)
    ax.set_xlim(0, geo.wrap)
    ax.set_ylim(layout.n_lines + 0.1, 0)
    ax.set_axis_off()
    if not record["tokens"]:
        ax.text(0, 0.72, "(empty completion)", fontsize=geo.font_pt, color="0.5", style="italic")
        return
    rects = [Rectangle((c.col, c.line + 0.06), len(c.text), 0.88) for c in layout.cells]
    colours = [credit_rgb(ratios[c.token]) for c in layout.cells]
    ax.add_collection(PatchCollection(rects, facecolors=colours, edgecolors="none"))
    for c in layout.cells:
        _png_cell_text(ax, c, ratios[c.token], geo.font_pt)
    bars = [[(col + 0.5, line + 0.02), (col + 0.5, line + 0.98)] for _, line, col in layout.boundaries]
    ax.add_collection(LineCollection(bars, colors="black", linewidths=1.6))
    for k, line, col in layout.boundaries:
        ax.text(
            col + 0.75,
            line + 0.02,
            str(k),
            fontsize=geo.font_pt * 0.62,
            color="black",
            va="top",
            ha="left",
            weight="bold",
            zorder=4,
        )


def _png_cell_text(ax: Any, cell: TextCell, ratio: float, font_pt: float) -> None:
    """Draw one cell's characters; leading spaces are skipped by shifting, since a left-aligned text
    box may start at the first ink rather than at the first character's origin."""
    stripped = cell.text.lstrip(" ")
    if not stripped:
        return
    colour = "white" if is_dark(ratio) else ("0.55" if cell.newline else "black")
    ax.text(
        cell.col + len(cell.text) - len(stripped),
        cell.line + 0.72,
        stripped,
        fontsize=font_pt,
        family=MONO_FONT,
        color=colour,
        va="baseline",
        ha="left",
        parse_math=False,
        zorder=3,
    )


def values_svg(record: Mapping[str, Any], width_in: float = 10.0, height_in: float = 3.0) -> str:
    """The values panel of :func:`render_png` as an inline SVG element (for the HTML view)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Text as <text> elements (searchable, small), no metadata (no date, no links): a page that is
    # the same for the same record.
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "rredcot"}):
        fig = plt.figure(figsize=(width_in, height_in))
        try:
            ax = fig.add_axes([0.08, 0.14, 0.84, 0.68])
            plot_values(ax, record)
            ax.tick_params(labelbottom=True)
            ax.set_xlabel("token index (exit point)", fontsize=8)
            buffer = io.StringIO()
            fig.savefig(buffer, format="svg", facecolor="white", metadata=dict.fromkeys(SVG_METADATA))
        finally:
            plt.close(fig)
    text = buffer.getvalue()
    return text[text.index("<svg") :]  # no XML prolog or doctype inside an HTML page
