"""Render how credit was assigned over one reasoning trace, as a self-contained HTML page and a PNG.

Numbers in a training log say *that* RREDCoT moved credit around; looking at the trace says whether
it moved it to the right place (the wrong step, the lucky guess). Both views show the same three
things: the exit-point values log v̂ along the trace (the signal credit is derived from), the token
coefficient σ per token, and the segment boundaries with each segment's share of the credit.

Input is one *credit record* per trace, a JSON-serialisable dict::

    trace_id, step, method, prompt, answer, reward, advantage   # identification and outcome
    tokens          list[str]           decoded text of each completion token
    sigma           list[float]         token coefficient σ (non-negative, sums to 1)
    segment_starts  list[int]           first token of each segment (first is 0; [] for an empty trace)
    cuts            list[int]           exit points (token indices 0..len(tokens))
    log_values      list[float | None]  log v̂ per cut (None where v̂ = 0, i.e. log v̂ = -inf)
    thought_nll, answer_nll             optional, list[float | None] per cut
    entropies                           optional, list[float] per token (bits)
    answer_reward                       optional float: r̂ of the answer segment after the model's
                                        own exit (the last segment when ``cuts`` end at its start)
    answer_baseline                     optional str: the final solution the answer segment was
                                        judged against (the model's greedy one at its exit)

σ is shown relative to uniform credit, σ·|o| (1 = every token weighted alike), on a diverging log
scale: blue below uniform, white at uniform, red above, clipped at ``2**±CLIP_LOG2``.
"""

from __future__ import annotations

import bisect
import html
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rredcot.jsonl import atomic_path, write_jsonl

# σ·|o| is clipped to [2**-CLIP_LOG2, 2**CLIP_LOG2] before colouring: beyond 8x (or 1/8 of) uniform
# the eye cannot tell shades apart anyway, and a single near-zero σ must not wash out the rest.
CLIP_LOG2: float = 3.0

# Diverging scale (ColorBrewer RdBu, white in the middle) as (position in [-1, 1], RGB in [0, 1]).
_STOPS: tuple[tuple[float, tuple[float, float, float]], ...] = (
    (-1.0, (0x21 / 255, 0x66 / 255, 0xAC / 255)),
    (-0.5, (0x92 / 255, 0xC5 / 255, 0xDE / 255)),
    (0.0, (1.0, 1.0, 1.0)),
    (0.5, (0xF4 / 255, 0xA5 / 255, 0x82 / 255)),
    (1.0, (0xB2 / 255, 0x18 / 255, 0x2B / 255)),
)

# Past this |position| the background is dark enough that text must be white to stay legible.
_DARK: float = 0.75

# Tolerance of the "σ sums to 1" check: σ is usually computed in float32.
_SIGMA_SUM_TOL: float = 1e-3

# DejaVu Sans Mono (matplotlib's bundled monospace font) advances every glyph by 1233/2048 em.
_MONO_FONT = "DejaVu Sans Mono"
_MONO_ADVANCE_EM: float = 1233 / 2048

_OPTIONAL_PER_CUT = ("thought_nll", "answer_nll")


# --------------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------------


def validate_record(record: Mapping[str, Any]) -> None:
    """Raise ValueError naming the first bad field, so a broken record fails before anything is drawn."""
    if not isinstance(record, Mapping):
        raise ValueError(f"credit record must be a mapping, got {type(record).__name__}")
    for key in ("trace_id", "method", "prompt", "answer"):
        if not isinstance(_field(record, key), str):
            raise ValueError(f"'{key}' must be a string")
    step = _field(record, "step")
    if step is not None and not _is_int(step):
        raise ValueError("'step' must be an int or None")
    for key in ("reward", "advantage"):
        if not _is_finite(_field(record, key)):
            raise ValueError(f"'{key}' must be a finite number")
    n_tokens = _check_tokens(record)
    _check_sigma(record, n_tokens)
    _check_segment_starts(record, n_tokens)
    n_cuts = _check_cuts(record, n_tokens)
    _check_per_cut(record, "log_values", n_cuts)
    for key in _OPTIONAL_PER_CUT:
        if record.get(key) is not None:
            _check_per_cut(record, key, n_cuts)
    if record.get("entropies") is not None:
        values = _number_list(record, "entropies", n_tokens)
        if any(not _is_finite(h) or h < 0 for h in values):
            raise ValueError("'entropies' must be finite and non-negative")
    if record.get("answer_reward") is not None and not _is_finite(record["answer_reward"]):
        raise ValueError("'answer_reward' must be a finite number or None")
    if record.get("answer_baseline") is not None and not isinstance(record["answer_baseline"], str):
        raise ValueError("'answer_baseline' must be a string or None")


def _field(record: Mapping[str, Any], key: str) -> Any:
    if key not in record:
        raise ValueError(f"credit record is missing '{key}'")
    return record[key]


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_finite(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def _sequence(record: Mapping[str, Any], key: str) -> Sequence[Any]:
    value = _field(record, key)
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise ValueError(f"'{key}' must be a list")
    return value


def _number_list(record: Mapping[str, Any], key: str, length: int) -> Sequence[Any]:
    values = _sequence(record, key)
    if len(values) != length:
        raise ValueError(f"'{key}' has {len(values)} entries, expected {length}")
    return values


def _check_tokens(record: Mapping[str, Any]) -> int:
    tokens = _sequence(record, "tokens")
    if not all(isinstance(t, str) for t in tokens):
        raise ValueError("'tokens' must be a list of strings")
    return len(tokens)


def _check_sigma(record: Mapping[str, Any], n_tokens: int) -> None:
    sigma = _number_list(record, "sigma", n_tokens)
    if any(not _is_finite(s) or s < 0 for s in sigma):
        raise ValueError("'sigma' must be finite and non-negative (no NaN)")
    if n_tokens and abs(math.fsum(sigma) - 1.0) > _SIGMA_SUM_TOL:
        raise ValueError(f"'sigma' must sum to 1, sums to {math.fsum(sigma):.6g}")


def _check_segment_starts(record: Mapping[str, Any], n_tokens: int) -> None:
    starts = _sequence(record, "segment_starts")
    if not all(_is_int(b) for b in starts):
        raise ValueError("'segment_starts' must be a list of ints")
    if n_tokens == 0:
        if starts:
            raise ValueError("'segment_starts' must be empty for an empty trace")
        return
    if not starts or starts[0] != 0:
        raise ValueError("'segment_starts' must begin with 0")
    if not _strictly_increasing(starts) or starts[-1] >= n_tokens:
        raise ValueError(f"'segment_starts' must increase strictly and stay below {n_tokens}")


def _check_cuts(record: Mapping[str, Any], n_tokens: int) -> int:
    cuts = _sequence(record, "cuts")
    if not all(_is_int(c) for c in cuts):
        raise ValueError("'cuts' must be a list of ints")
    if any(c < 0 or c > n_tokens for c in cuts):
        raise ValueError(f"'cuts' must lie in 0..{n_tokens} (the number of tokens)")
    if not _strictly_increasing(cuts):
        raise ValueError("'cuts' must increase strictly")
    return len(cuts)


def _check_per_cut(record: Mapping[str, Any], key: str, n_cuts: int) -> None:
    values = _number_list(record, key, n_cuts)
    if any(v is not None and not _is_finite(v) for v in values):
        raise ValueError(f"'{key}' must be finite numbers or None (use None for -inf)")


def _strictly_increasing(xs: Sequence[int]) -> bool:
    return all(b > a for a, b in zip(xs[:-1], xs[1:], strict=True))


# --------------------------------------------------------------------------------------------------
# Shared quantities and the colour scale
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Segment:
    """One segment's token range and credit, as both views print it."""

    index: int
    start: int
    end: int
    share: float  # Σσ over the segment
    length_share: float  # the share uniform credit would give it, to read ``share`` against
    delta_log_value: float | None  # log v̂(end) - log v̂(start) when the cuts are the segment bounds


def credit_position(ratio: float) -> float:
    """Position of σ·|o| on the colour scale: log2, clipped to ±CLIP_LOG2, scaled to [-1, 1]."""
    if ratio <= 0:
        return -1.0
    return max(-1.0, min(1.0, math.log2(ratio) / CLIP_LOG2))


def credit_rgb(ratio: float) -> tuple[float, float, float]:
    """Background colour for a token with σ·|o| = ``ratio`` (shared by the HTML and PNG views)."""
    pos = credit_position(ratio)
    for (p0, c0), (p1, c1) in zip(_STOPS[:-1], _STOPS[1:], strict=True):
        if pos <= p1:
            w = (pos - p0) / (p1 - p0)
            return (c0[0] + w * (c1[0] - c0[0]), c0[1] + w * (c1[1] - c0[1]), c0[2] + w * (c1[2] - c0[2]))
    return _STOPS[-1][1]


def credit_hex(ratio: float) -> str:
    """``credit_rgb`` as a CSS ``#rrggbb`` string."""
    return "#" + "".join(f"{round(255 * c):02x}" for c in credit_rgb(ratio))


def _is_dark(ratio: float) -> bool:
    return abs(credit_position(ratio)) > _DARK


def _ratios(record: Mapping[str, Any]) -> list[float]:
    """σ·|o| per token."""
    n = len(record["tokens"])
    return [float(s) * n for s in record["sigma"]]


def _segment_of(record: Mapping[str, Any]) -> list[int]:
    """Segment index of every token."""
    starts = list(record["segment_starts"])
    return [bisect.bisect_right(starts, t) - 1 for t in range(len(record["tokens"]))]


def _segments(record: Mapping[str, Any]) -> list[_Segment]:
    """Segments with their credit share; Δ log v̂ only where cuts k and k+1 bound segment k.

    Cuts sit at the segment starts, plus one at the end of the thinking part: the trace's end (before
    its EOS) or, when the model exits on its own, the start of the answer segment, whose Δ is the
    record's ``answer_reward``.
    """
    n = len(record["tokens"])
    starts = list(record["segment_starts"])
    bounds = starts + [n]
    cuts = list(record["cuts"])
    aligned = cuts[: len(starts)] == starts[: len(cuts)]
    lv = record["log_values"]
    out = []
    for k, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        delta = None
        if aligned and k + 1 == len(cuts) and record.get("answer_reward") is not None:
            delta = float(record["answer_reward"])  # the answer segment, after the model's exit
        elif aligned and k + 1 < len(cuts) and lv[k] is not None and lv[k + 1] is not None:
            delta = float(lv[k + 1]) - float(lv[k])
        out.append(_Segment(k, a, b, math.fsum(record["sigma"][a:b]), (b - a) / n, delta))
    return out


def _series(record: Mapping[str, Any]) -> list[tuple[str, list[float | None]]]:
    """The per-cut NLL components present in the record, labelled."""
    labels = {"thought_nll": "thought NLL", "answer_nll": "answer NLL"}
    return [(labels[k], list(record[k])) for k in _OPTIONAL_PER_CUT if record.get(k) is not None]


def _fmt(x: float | None, spec: str = ".4g") -> str:
    return "−∞" if x is None else format(x, spec)


# --------------------------------------------------------------------------------------------------
# HTML
# --------------------------------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color: #222;
       margin: 1.5em auto; max-width: 1100px; padding: 0 1em; }
h1 { font-size: 1.3em; margin-bottom: .3em; } h2 { font-size: 1.05em; margin: 1.4em 0 .4em; }
table { border-collapse: collapse; font-size: .9em; }
td, th { padding: .15em .7em; border-bottom: 1px solid #e4e4e4; text-align: left; vertical-align: top; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
.mono, .trace, .prompt { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace; }
.prompt, .answer { white-space: pre-wrap; }
.prompt { background: #f6f6f6; padding: .5em .7em; border-radius: 4px; font-size: .9em; }
.trace { white-space: pre-wrap; overflow-wrap: anywhere; line-height: 1.9; font-size: .92em;
         border: 1px solid #ccc; border-radius: 4px; padding: .7em .9em; }
.tok { border-radius: 2px; }
.seg { display: inline-block; border-left: 2px solid #222; margin: 0 2px 0 3px; padding-left: 2px;
       font-family: system-ui, sans-serif; font-size: .62em; line-height: 1.3; vertical-align: super;
       color: #222; white-space: nowrap; user-select: none; }
.legend { display: flex; align-items: center; gap: 0; font-size: .8em; margin: .4em 0; }
.legend span { display: inline-block; width: 3.2em; text-align: center; padding: .15em 0; }
.legend .cap { width: auto; padding: 0 .8em 0 0; }
.empty { color: #888; font-style: italic; }
svg text { font-family: system-ui, sans-serif; }
"""


def render_html(record: Mapping[str, Any]) -> str:
    """A self-contained HTML page (inline CSS and SVG only) showing the credit over one trace."""
    validate_record(record)
    title = f"Credit view: {record['trace_id']}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_esc(title)}</title><style>{_CSS}</style></head><body>",
        _html_header(record),
        "<h2>Exit-point values</h2>",
        _svg_chart(record),
        "<h2>Completion: token credit σ·|o|</h2>",
        _html_legend(),
        _html_trace(record),
        "<h2>Segments</h2>",
        _html_segments(record),
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def _esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _html_header(record: Mapping[str, Any]) -> str:
    n_seg = len(record["segment_starts"])
    rows = [
        ("step", "–" if record["step"] is None else str(record["step"])),
        ("method", record["method"]),
        ("reward", format(float(record["reward"]), ".4g")),
        ("advantage", format(float(record["advantage"]), "+.4g")),
        ("tokens / segments", f"{len(record['tokens'])} / {n_seg}"),
    ]
    cells = "".join(f"<tr><th>{_esc(k)}</th><td class='mono'>{_esc(v)}</td></tr>" for k, v in rows)
    answer = f"<tr><th>label answer</th><td class='mono answer'>{_esc(record['answer'])}</td></tr>"
    if record.get("answer_baseline") is not None:
        answer += (
            "<tr><th>greedy solution at the exit</th>"
            f"<td class='mono'>{_esc(record['answer_baseline'])}</td></tr>"
        )
    return (
        f"<h1>Trace <span class='mono'>{_esc(record['trace_id'])}</span></h1>"
        f"<table class='meta'>{cells}{answer}</table>"
        f"<h2>Prompt</h2><div class='prompt'>{_esc(record['prompt'])}</div>"
    )


def _html_legend() -> str:
    labels = ["1/8", "1/4", "1/2", "1", "2", "4", "8"]
    ratios = [2.0**e for e in range(-3, 4)]
    cells = "".join(
        f"<span style='background:{credit_hex(r)};{'color:#fff;' if _is_dark(r) else ''}'>{label}</span>"
        for r, label in zip(ratios, labels, strict=True)
    )
    return (
        "<div class='legend'><span class='cap'>σ·|o| (credit relative to uniform, log scale; "
        f"clipped at 1/8 and 8):</span>{cells}</div>"
    )


def _html_trace(record: Mapping[str, Any]) -> str:
    tokens = record["tokens"]
    if not tokens:
        return "<div class='trace'><span class='empty'>(empty completion)</span></div>"
    ratios, seg_of = _ratios(record), _segment_of(record)
    segments = {s.start: s for s in _segments(record)}
    entropies = record.get("entropies")
    out = []
    for t, text in enumerate(tokens):
        if t in segments:
            out.append(_html_boundary(segments[t]))
        h = None if entropies is None else float(entropies[t])
        out.append(_html_token(t, text, float(record["sigma"][t]), ratios[t], seg_of[t], h))
    return "<div class='trace'>" + "".join(out) + "</div>"


def _html_boundary(seg: _Segment) -> str:
    tip = (
        f"segment {seg.index}: tokens {seg.start}–{seg.end - 1}, credit share {seg.share:.1%} "
        f"(uniform would give {seg.length_share:.1%})"
    )
    return f"<span class='seg' title='{_esc(tip)}'>{seg.index} · {seg.share:.0%}</span>"


def _html_token(t: int, text: str, sigma: float, ratio: float, seg: int, entropy: float | None) -> str:
    tip = f"token {t} {text!r}\nσ = {sigma:.4g}\nσ·|o| = {ratio:.3g}\nsegment {seg}"
    if entropy is not None:
        tip += f"\nentropy {entropy:.3g} bits"
    style = f"background:{credit_hex(ratio)}" + (";color:#fff" if _is_dark(ratio) else "")
    return f"<span class='tok' style='{style}' title='{_esc(tip)}'>{_esc(text)}</span>"


def _html_segments(record: Mapping[str, Any]) -> str:
    segments = _segments(record)
    if not segments:
        return "<p class='empty'>(no segments)</p>"
    head = (
        "<tr><th class='num'>segment</th><th class='num'>tokens</th><th class='num'>credit share</th>"
        "<th class='num'>share / length share</th><th class='num'>Δ log v̂</th><th>starts with</th></tr>"
    )
    rows = [head]
    for s in segments:
        text = "".join(record["tokens"][s.start : s.end])
        preview = text[:60] + ("…" if len(text) > 60 else "")
        rel = s.share / s.length_share if s.length_share else float("nan")
        delta = "" if s.delta_log_value is None else format(s.delta_log_value, "+.4g")
        rows.append(
            f"<tr><td class='num'>{s.index}</td><td class='num'>{s.start}–{s.end - 1}</td>"
            f"<td class='num' style='background:{credit_hex(rel)}'>{s.share:.1%}</td>"
            f"<td class='num'>{rel:.3g}</td><td class='num'>{delta}</td>"
            f"<td class='mono'>{_esc(preview.replace(chr(10), '↵'))}</td></tr>"
        )
    return "<table class='segments'>" + "".join(rows) + "</table>"


# --------------------------------------------------------------------------------------------------
# Inline SVG chart of the exit-point values
# --------------------------------------------------------------------------------------------------

_SVG_W, _SVG_H = 960, 290
_SVG_MARGIN = {"left": 64, "right": 64, "top": 44, "bottom": 42}
_LOG_VALUE_COLOUR = "#1f4e79"
_NLL_COLOURS = ("#d95f02", "#7570b3")


@dataclass(frozen=True)
class _Scale:
    """Linear map from data to pixel coordinates along one axis."""

    lo: float
    hi: float
    p0: float
    p1: float

    def __call__(self, v: float) -> float:
        return self.p0 + (v - self.lo) / (self.hi - self.lo) * (self.p1 - self.p0)


def _padded_range(values: Sequence[float | None]) -> tuple[float, float]:
    """Axis range around the finite values with a margin (a unit range if there is nothing to show)."""
    finite = [float(v) for v in values if v is not None]
    if not finite:
        return 0.0, 1.0
    lo, hi = min(finite), max(finite)
    if hi - lo < 1e-12:
        return lo - 1.0, hi + 1.0
    pad = 0.08 * (hi - lo)
    return lo - pad, hi + pad


def _nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values (1, 2, 2.5, 5 x 10^k steps) within [lo, hi]."""
    raw = (hi - lo) / n
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9)
    ticks = []
    for i in range(first, first + 2 * n + 2):
        if i * step > hi + 1e-9 * step:
            break
        ticks.append(round(i * step, 12))
    return ticks


def _svg_chart(record: Mapping[str, Any]) -> str:
    """Line chart of log v̂ (left axis) and the NLL components (right axis) against the cut's token index."""
    m = _SVG_MARGIN
    cuts, log_values, series = list(record["cuts"]), list(record["log_values"]), _series(record)
    n = max(len(record["tokens"]), 1)
    xs = _Scale(-0.012 * n, 1.012 * n, m["left"], _SVG_W - m["right"])  # room for markers at 0 and L
    ys = _Scale(*_padded_range(log_values), _SVG_H - m["bottom"], m["top"])
    nll_values = [v for _, vals in series for v in vals]
    yr = _Scale(*_padded_range(nll_values), _SVG_H - m["bottom"], m["top"])
    body = [_svg_frame(xs, ys, yr if series else None)]
    body += [_svg_cut_line(xs, ys, j, c) for j, c in enumerate(cuts)]
    body.append(_svg_series(xs, ys, cuts, log_values, "log v̂", _LOG_VALUE_COLOUR, dash=""))
    for (label, values), colour in zip(series, _NLL_COLOURS, strict=False):
        body.append(_svg_series(xs, yr, cuts, values, label, colour, dash="5 3"))
    body.append(_svg_legend(series))
    if not cuts:
        body.append(
            f"<text x='{_SVG_W / 2}' y='{_SVG_H / 2}' text-anchor='middle' fill='#888'>no exit points</text>"
        )
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{_SVG_W}' height='{_SVG_H}' "
        f"viewBox='0 0 {_SVG_W} {_SVG_H}' role='img'><title>exit-point values along the trace</title>"
        + "".join(body)
        + "</svg>"
    )


def _svg_frame(xs: _Scale, ys: _Scale, yr: _Scale | None) -> str:
    """Plot box, ticks and axis labels."""
    top, bottom = ys.p1, ys.p0
    out = [
        f"<rect x='{xs.p0}' y='{top}' width='{xs.p1 - xs.p0}' height='{bottom - top}' "
        "fill='none' stroke='#999'/>"
    ]
    for v in _nice_ticks(xs.lo, xs.hi):
        if v >= 0 and v == int(v):
            x = xs(v)
            out.append(f"<line x1='{x:.1f}' y1='{bottom}' x2='{x:.1f}' y2='{bottom + 4}' stroke='#999'/>")
            out.append(
                f"<text x='{x:.1f}' y='{bottom + 16}' font-size='11' text-anchor='middle'>{int(v)}</text>"
            )
    out.append(
        f"<text x='{(xs.p0 + xs.p1) / 2}' y='{_SVG_H - 6}' font-size='12' text-anchor='middle'>"
        "token index of the exit point (cut)</text>"
    )
    out += _svg_y_axis(ys, xs.p0, -1, "log v̂", _LOG_VALUE_COLOUR)
    if yr is not None:
        out += _svg_y_axis(yr, xs.p1, 1, "NLL (nats)", "#555")
    return "".join(out)


def _svg_y_axis(ys: _Scale, x: float, side: int, label: str, colour: str) -> list[str]:
    """Ticks on the left (side = -1) or right (side = 1) edge of the plot box."""
    anchor = "end" if side < 0 else "start"
    out = []
    for v in _nice_ticks(ys.lo, ys.hi):
        y = ys(v)
        out.append(f"<line x1='{x}' y1='{y:.1f}' x2='{x + 4 * side}' y2='{y:.1f}' stroke='#999'/>")
        out.append(
            f"<text x='{x + 7 * side}' y='{y + 4:.1f}' font-size='11' text-anchor='{anchor}' "
            f"fill='{colour}'>{v:g}</text>"
        )
    lx = x + 50 * side
    ly = (ys.p0 + ys.p1) / 2
    out.append(
        f"<text x='{lx}' y='{ly}' font-size='12' text-anchor='middle' fill='{colour}' "
        f"transform='rotate(-90 {lx} {ly})'>{_esc(label)}</text>"
    )
    return out


def _svg_cut_line(xs: _Scale, ys: _Scale, j: int, cut: int) -> str:
    x = xs(cut)
    return (
        f"<line class='cut' x1='{x:.1f}' y1='{ys.p1}' x2='{x:.1f}' y2='{ys.p0}' stroke='#bbb' "
        f"stroke-dasharray='3 3'><title>exit point {j} at token {cut}</title></line>"
        f"<text x='{x:.1f}' y='{ys.p1 - 5}' font-size='10' text-anchor='middle' fill='#777'>{j}</text>"
    )


def _svg_series(
    xs: _Scale,
    ys: _Scale,
    cuts: Sequence[int],
    values: Sequence[float | None],
    label: str,
    colour: str,
    dash: str,
) -> str:
    """Polyline through the finite points (broken at None) plus one marker per cut."""
    out, run = [], []
    dash_attr = f" stroke-dasharray='{dash}'" if dash else ""
    for c, v in [*zip(cuts, values, strict=True), (None, None)]:
        if v is not None:
            run.append(f"{xs(c):.1f},{ys(float(v)):.1f}")
            continue
        if len(run) > 1:
            points = " ".join(run)
            out.append(
                f"<polyline points='{points}' fill='none' stroke='{colour}' stroke-width='2'{dash_attr}/>"
            )
        run = []
    for j, (c, v) in enumerate(zip(cuts, values, strict=True)):
        out.append(
            _svg_marker(
                xs(c),
                None if v is None else ys(float(v)),
                ys.p0,
                colour,
                f"{label} at exit {j} (token {c}) = {_fmt(v)}",
            )
        )
    return "".join(out)


def _svg_marker(x: float, y: float | None, bottom: float, colour: str, tip: str) -> str:
    """A dot at the value, or a hollow triangle on the bottom edge for a value of -inf."""
    if y is None:
        pts = f"{x - 5:.1f},{bottom - 9:.1f} {x + 5:.1f},{bottom - 9:.1f} {x:.1f},{bottom - 1:.1f}"
        return f"<polygon points='{pts}' fill='white' stroke='{colour}'><title>{_esc(tip)}</title></polygon>"
    return f"<circle cx='{x:.1f}' cy='{y:.1f}' r='3.5' fill='{colour}'><title>{_esc(tip)}</title></circle>"


def _svg_legend(series: Sequence[tuple[str, list[float | None]]]) -> str:
    items = [("log v̂ (left axis; ▽ = −∞)", _LOG_VALUE_COLOUR, "")]
    items += [
        (f"{label} (right axis)", c, "5 3") for (label, _), c in zip(series, _NLL_COLOURS, strict=False)
    ]
    out, x = [], _SVG_MARGIN["left"] + 10
    for label, colour, dash in items:
        dash_attr = f" stroke-dasharray='{dash}'" if dash else ""
        out.append(
            f"<line x1='{x}' y1='14' x2='{x + 22}' y2='14' stroke='{colour}' stroke-width='2'{dash_attr}/>"
        )
        out.append(f"<text x='{x + 27}' y='18' font-size='11' fill='{colour}'>{_esc(label)}</text>")
        x += 40 + 7 * len(label)
    return "".join(out)


# --------------------------------------------------------------------------------------------------
# PNG
# --------------------------------------------------------------------------------------------------


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
        return self.wrap * self.font_pt * _MONO_ADVANCE_EM / 72

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
    geo = _PngGeometry(font_pt=9.5, wrap=wrap, n_lines=layout.n_lines)
    fig = plt.figure(figsize=(geo.width, geo.height))
    try:
        _png_header(fig, geo, record)
        ax_values = fig.add_axes(geo.rect(geo.values_y, geo.values_h))
        ax_sigma = fig.add_axes(geo.rect(geo.sigma_y, geo.sigma_h), sharex=ax_values)
        _png_values(ax_values, record)
        _png_sigma(ax_sigma, record, geo)
        _png_text_title(fig, geo)
        _png_text(fig.add_axes(geo.rect(geo.text_y, geo.text_h)), record, layout, geo)
        out = Path(path)
        with atomic_path(out) as tmp:
            fig.savefig(tmp, format="png", dpi=min(dpi, 30000 / geo.height), facecolor="white")
    finally:
        plt.close(fig)
    return out


def _png_header(fig: Any, geo: _PngGeometry, record: Mapping[str, Any]) -> None:
    """Title lines: identification, outcome, label answer and prompt."""
    step = "–" if record["step"] is None else record["step"]
    line1 = (
        f"trace {record['trace_id']}   step {step}   {record['method']}   "
        f"reward {float(record['reward']):.4g}   advantage {float(record['advantage']):+.4g}"
    )
    line2 = f"label: {_one_line(record['answer'], 40)}    prompt: {_one_line(record['prompt'], 100)}"
    x, top = geo.left / geo.width, 1 - 0.1 / geo.height
    fig.text(x, top, line1, fontsize=11, weight="bold", va="top", parse_math=False)
    fig.text(x, top - 0.27 / geo.height, line2, fontsize=8.5, va="top", parse_math=False)


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


def _png_values(ax: Any, record: Mapping[str, Any]) -> None:
    """Top panel: log v̂ per exit point (gaps at -inf), NLL components on a twin axis."""
    cuts, lv = list(record["cuts"]), list(record["log_values"])
    _png_boundaries(ax, record)
    handles = []
    if cuts:
        y = [math.nan if v is None else float(v) for v in lv]
        handles += ax.plot(cuts, y, "o-", color=_LOG_VALUE_COLOUR, lw=1.8, ms=4, label="log v̂", zorder=3)
        inf_cuts = [c for c, v in zip(cuts, lv, strict=True) if v is None]
        if inf_cuts:
            trans = ax.get_xaxis_transform()
            ax.plot(
                inf_cuts,
                [0.05] * len(inf_cuts),
                "v",
                mfc="white",
                color=_LOG_VALUE_COLOUR,
                ms=7,
                transform=trans,
                clip_on=False,
                zorder=4,
            )
    else:
        ax.text(0.5, 0.5, "no exit points", transform=ax.transAxes, ha="center", color="0.5")
    ax.set_ylabel("log v̂", color=_LOG_VALUE_COLOUR)
    _png_xlim(ax, len(record["tokens"]))
    ax.tick_params(labelbottom=False)
    ax.grid(axis="y", color="0.92")
    series = _series(record)
    if series and cuts:
        twin = ax.twinx()
        for (label, values), colour in zip(series, _NLL_COLOURS, strict=False):
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
    ratios = _ratios(record)
    n = len(ratios)
    if n:
        ax.bar(range(n), ratios, width=1.0, align="edge", color=[credit_rgb(r) for r in ratios], lw=0)
        ax.stairs(ratios, range(n + 1), color="0.3", lw=0.6)
    ax.axhline(1.0, color="0.45", lw=0.8, ls=":")
    _png_boundaries(ax, record)
    _png_xlim(ax, n)
    trans = ax.get_xaxis_transform()
    for seg in _share_labels(_segments(record), max(n, 1), geo.text_w):
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


def _share_labels(segments: list[_Segment], n_tokens: int, width_in: float) -> list[_Segment]:
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

    ratios = _ratios(record)
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
    colour = "white" if _is_dark(ratio) else ("0.55" if cell.newline else "black")
    ax.text(
        cell.col + len(cell.text) - len(stripped),
        cell.line + 0.72,
        stripped,
        fontsize=font_pt,
        family=_MONO_FONT,
        color=colour,
        va="baseline",
        ha="left",
        parse_math=False,
        zorder=3,
    )


# --------------------------------------------------------------------------------------------------
# Batch output
# --------------------------------------------------------------------------------------------------


def write_views(records: Sequence[Mapping[str, Any]], out_dir: str | Path, stem: str = "trace") -> list[Path]:
    """Write ``{stem}_{i}.html`` and ``{stem}_{i}.png`` per record and all records to ``{stem}s.jsonl``.

    Every record is validated before anything is written, so a bad record leaves no partial set of
    views behind; each file is written atomically. Returns the paths in write order.
    """
    for i, record in enumerate(records):
        try:
            validate_record(record)
        except ValueError as err:
            raise ValueError(f"record {i}: {err}") from err
    out_dir = Path(out_dir)
    written = []
    for i, record in enumerate(records):
        html_path = out_dir / f"{stem}_{i}.html"
        with atomic_path(html_path) as tmp:
            tmp.write_text(render_html(record), encoding="utf-8")
        written += [html_path, render_png(record, out_dir / f"{stem}_{i}.png")]
    jsonl_path = out_dir / f"{stem}s.jsonl"
    write_jsonl(jsonl_path, [dict(r) for r in records])
    written.append(jsonl_path)
    return written
