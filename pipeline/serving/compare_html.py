"""The HTML page of `enginectl compare --html`, and the page parts the nightly's page shares.

    write_html(comparison, Path("compare.html"))   # one self-contained page, no network

`render_html` is pure: the tables of pipeline.serving.compare and inline SVG charts of
throughput against concurrency and, for artifacts whose proof has a capacity curve, of TTFT
p95 against the open-loop request rate (pipeline.serving.compare_curves), no scripts, fonts
or URLs. `PAGE_CSS`, `escape` and
`write_page` (atomic: a temporary file renamed over the target) are what `nightly --html`
uses too (pipeline.nightly.report).
"""

from __future__ import annotations

import html
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Final

from pipeline.serving.compare import (
    SUMMARY_HEADER,
    Comparison,
    heading,
    number,
    summary_cells,
    ttft,
)
from pipeline.serving.compare_curves import curve_chart
from registry.errors import UsageError

# Line colours of the chart, one per artifact (cycled); readable on white and by most
# colour-blind readers (Okabe-Ito).
PALETTE: Final = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9",
                  "#F0E442", "#000000")

PAGE_CSS: Final = """
body { font: 13px/1.4 system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; margin: 0 0 4px; }
p.note { color: #555; margin: 4px 0 16px; }
table { border-collapse: collapse; margin: 12px 0 24px; }
th, td { border: 1px solid #ccc; padding: 3px 6px; text-align: right; white-space: nowrap; }
th { background: #f3f3f3; vertical-align: bottom; }
td small, th small { color: #666; font-weight: normal; }
div.wide { overflow-x: auto; }
td.label, th.label { text-align: left; font-family: monospace; }
td.label span.swatch { display: inline-block; width: 10px; height: 10px; margin-right: 6px; }
svg text { font: 12px system-ui, sans-serif; fill: #222; }
svg .grid { stroke: #e5e5e5; }
svg .axis { stroke: #444; }
"""

# Chart geometry, in SVG user units.
_W, _H = 760, 380
_LEFT, _RIGHT, _TOP, _BOTTOM = 70, 250, 20, 50


def escape(value: object) -> str:
    return html.escape(str(value), quote=True)


def _nice_max(value: float) -> float:
    """The smallest 1, 2 or 5 × 10ⁿ at or above *value* (the chart's top)."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= value)


def _chart(comparison: Comparison) -> str:
    levels = comparison.concurrencies
    plot_w, plot_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM
    top = _nice_max(max((lv.output_tokens_per_s for row in comparison.rows
                         for lv in row.levels), default=0.0))

    def x(concurrency: int) -> float:
        index = levels.index(concurrency)
        return _LEFT + (plot_w * index / (len(levels) - 1) if len(levels) > 1 else plot_w / 2)

    def y(tokens_per_s: float) -> float:
        return _TOP + plot_h * (1 - tokens_per_s / top)

    out = [(f'<svg id="throughput" xmlns="http://www.w3.org/2000/svg" width="{_W}" '
            f'height="{_H}" viewBox="0 0 {_W} {_H}" role="img" '
            f'aria-label="output tokens/s by concurrency">')]
    for step in range(6):
        value = top * step / 5
        out.append(f'<line class="grid" x1="{_LEFT}" x2="{_LEFT + plot_w}" y1="{y(value):.1f}" '
                   f'y2="{y(value):.1f}"/>')
        out.append(f'<text x="{_LEFT - 6}" y="{y(value) + 4:.1f}" text-anchor="end">'
                   f"{value:g}</text>")
    for c in levels:
        out.append(f'<text x="{x(c):.1f}" y="{_TOP + plot_h + 18}" text-anchor="middle">'
                   f"{c}</text>")
    out.append(f'<line class="axis" x1="{_LEFT}" x2="{_LEFT}" y1="{_TOP}" '
               f'y2="{_TOP + plot_h}"/>')
    out.append(f'<line class="axis" x1="{_LEFT}" x2="{_LEFT + plot_w}" y1="{_TOP + plot_h}" '
               f'y2="{_TOP + plot_h}"/>')
    out.append(f'<text x="{_LEFT + plot_w / 2:.1f}" y="{_H - 8}" text-anchor="middle">'
               "concurrency</text>")
    out.append(f'<text transform="translate(16 {_TOP + plot_h / 2:.1f}) rotate(-90)" '
               'text-anchor="middle">output tokens/s</text>')
    legend = 0
    for index, row in enumerate(comparison.rows):
        if not row.levels:
            continue
        colour = PALETTE[index % len(PALETTE)]
        points = " ".join(f"{x(lv.concurrency):.1f},{y(lv.output_tokens_per_s):.1f}"
                          for lv in row.levels)
        out.append(f'<polyline class="series" data-digest="{escape(row.digest)}" fill="none" '
                   f'stroke="{colour}" stroke-width="2" points="{points}">'
                   f"<title>{escape(row.label)}</title></polyline>")
        for lv in row.levels:
            out.append(f'<circle cx="{x(lv.concurrency):.1f}" cy="{y(lv.output_tokens_per_s):.1f}"'
                       f' r="3.5" fill="{colour}"><title>{escape(row.label)}: c={lv.concurrency}, '
                       f"{lv.output_tokens_per_s:.1f} tok/s</title></circle>")
        ly = _TOP + 10 + 20 * legend
        lx = _LEFT + plot_w + 16
        out.append(f'<g class="legend"><line x1="{lx}" x2="{lx + 20}" y1="{ly}" y2="{ly}" '
                   f'stroke="{colour}" stroke-width="3"/><text x="{lx + 26}" y="{ly + 4}">'
                   f"{escape(row.kind)} {escape(row.quant or '')} {escape(row.digest[7:15])}"
                   "</text></g>")
        legend += 1
    out.append("</svg>")
    return "\n".join(out)


def render_html(comparison: Comparison) -> str:
    """One self-contained page: the tables and an inline SVG chart of throughput against
    concurrency, one line per artifact. No scripts, fonts or URLs: it renders offline."""
    levels = comparison.concurrencies
    title = heading(comparison)
    head = "".join(f"<th>{escape(h)}</th>" for h in SUMMARY_HEADER)
    head += "".join(f"<th>c={c}<br><small>tok/s<br>TTFT p50/p95 s</small></th>" for c in levels)
    body = []
    for index, row in enumerate(comparison.rows):
        swatch = PALETTE[index % len(PALETTE)] if row.levels else "transparent"
        found = [row.level(c) for c in levels]
        cells = "".join(f"<td>{escape(cell)}</td>" for cell in summary_cells(row))
        cells += "".join(
            f"<td>{escape(number(lv.output_tokens_per_s if lv else None, '.1f'))}<br>"
            f"<small>{escape(ttft(lv))}</small></td>" for lv in found)
        body.append(f'<tr class="artifact" data-digest="{escape(row.digest)}"><td class="label">'
                    f'<span class="swatch" style="background:{swatch}"></span>'
                    f"{escape(row.digest[7:19])}</td>{cells}</tr>")
    note = ("Output tokens/s, time to first token and $ per 1M output tokens from each "
            "artifact's latest passing smoke report; build time from its stage run; "
            "ready is the cold start, warm a start from its warm cache. A dash means not measured.")
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>enginectl compare: {escape(title)}</title>",
        f"<style>{PAGE_CSS}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
        f'<p class="note">{escape(note)}</p>',
        '<div class="wide"><table id="compare">',
        f'<thead><tr><th class="label">artifact</th>{head}</tr></thead>',
        "<tbody>", *body, "</tbody></table></div>",
        _chart(comparison) if levels else "<p>No passing smoke report to chart.</p>",
        curve_chart(comparison, PALETTE),
        "</body></html>",
        "",
    ])


def write_html(comparison: Comparison, path: Path | str) -> Path:
    """Write `render_html(comparison)` to *path* atomically; the absolute path written."""
    return write_page(path, lambda: render_html(comparison))


def write_page(path: Path | str, render: Callable[[], str]) -> Path:
    """Write the page *render* makes to *path* atomically (a temporary file beside it,
    renamed over it); the absolute path written. A missing directory is `UsageError`
    (`--html PATH`), said before anything is rendered."""
    path = Path(path).resolve()
    if not path.parent.is_dir():
        raise UsageError(f"--html {path}: directory {path.parent} does not exist")
    text = render()
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        Path(temp).chmod(0o644)
        Path(temp).replace(path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return path
