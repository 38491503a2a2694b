"""Pictures of how credit was assigned over one trace: an HTML page and a PNG per credit record.

Numbers in a training log say *that* RREDCoT moved credit around; looking at the trace says whether
it moved it to the right place. The record format is :mod:`rredcot.viz.credit_record`'s; the views
are :mod:`rredcot.viz.credit_html` and :mod:`rredcot.viz.credit_png` (matplotlib, which also draws
the HTML page's chart). :func:`write_views` writes a batch of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rredcot.infra.io import atomic_path, write_jsonl
from rredcot.viz.credit_html import render_html
from rredcot.viz.credit_png import layout_text, render_png
from rredcot.viz.credit_record import credit_hex, credit_rgb, validate_record

__all__ = [
    "credit_hex",
    "credit_rgb",
    "layout_text",
    "render_html",
    "render_png",
    "validate_record",
    "write_views",
]


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
