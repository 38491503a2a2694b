"""The HTML view of a credit record: a self-contained page (inline CSS, the values chart as inline
SVG) with every token shaded by its credit and a tooltip of its σ, segment and entropy."""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

from rredcot.viz.credit_png import values_svg
from rredcot.viz.credit_record import (
    Segment,
    credit_hex,
    is_dark,
    record_segments,
    token_ratios,
    token_segments,
    uniform_reason,
    validate_record,
)

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
.uniform { color: #b2182b; font-weight: 600; margin: .2em 0 .6em; }
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
        values_svg(record),
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
    reason = uniform_reason(record)
    note = "" if reason is None else f"<p class='uniform'>{_esc(reason)}</p>"
    return (
        f"<h1>Trace <span class='mono'>{_esc(record['trace_id'])}</span></h1>{note}"
        f"<table class='meta'>{cells}{answer}</table>"
        f"<h2>Prompt</h2><div class='prompt'>{_esc(record['prompt'])}</div>"
    )


def _html_legend() -> str:
    labels = ["1/8", "1/4", "1/2", "1", "2", "4", "8"]
    ratios = [2.0**e for e in range(-3, 4)]
    cells = "".join(
        f"<span style='background:{credit_hex(r)};{'color:#fff;' if is_dark(r) else ''}'>{label}</span>"
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
    ratios, seg_of = token_ratios(record), token_segments(record)
    segments = {s.start: s for s in record_segments(record)}
    entropies = record.get("entropies")
    out = []
    for t, text in enumerate(tokens):
        if t in segments:
            out.append(_html_boundary(segments[t]))
        h = None if entropies is None else float(entropies[t])
        out.append(_html_token(t, text, float(record["sigma"][t]), ratios[t], seg_of[t], h))
    return "<div class='trace'>" + "".join(out) + "</div>"


def _html_boundary(seg: Segment) -> str:
    tip = (
        f"segment {seg.index}: tokens {seg.start}–{seg.end - 1}, credit share {seg.share:.1%} "
        f"(uniform would give {seg.length_share:.1%})"
    )
    return f"<span class='seg' title='{_esc(tip)}'>{seg.index} · {seg.share:.0%}</span>"


def _html_token(t: int, text: str, sigma: float, ratio: float, seg: int, entropy: float | None) -> str:
    tip = f"token {t} {text!r}\nσ = {sigma:.4g}\nσ·|o| = {ratio:.3g}\nsegment {seg}"
    if entropy is not None:
        tip += f"\nentropy {entropy:.3g} bits"
    style = f"background:{credit_hex(ratio)}" + (";color:#fff" if is_dark(ratio) else "")
    return f"<span class='tok' style='{style}' title='{_esc(tip)}'>{_esc(text)}</span>"


def _html_segments(record: Mapping[str, Any]) -> str:
    segments = record_segments(record)
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
