"""The latency-against-rate chart of `enginectl compare --html`: each artifact's capacity
curve (`pipeline.serving.capacity`), TTFT p95 against the offered request rate, one line per
artifact that has one. Pure: inline SVG, no scripts."""

from __future__ import annotations

import html
import math
from typing import Final

from pipeline.serving.compare import Comparison

_W, _H = 760, 380
_LEFT, _RIGHT, _TOP, _BOTTOM = 70, 250, 20, 50
_STEPS: Final = 5


def _nice_max(value: float) -> float:
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= value)


def curve_chart(comparison: Comparison, palette: tuple[str, ...]) -> str:
    """The SVG (id `capacity`), or "" when no row has a curve. Colours follow *palette* by
    row index, as the throughput chart's do."""
    rows = [(i, row) for i, row in enumerate(comparison.rows)
            if any(p95 is not None for _, p95 in row.curve)]
    if not rows:
        return ""
    plot_w, plot_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM
    right = _nice_max(max(rate for _, row in rows for rate, _ in row.curve))
    top = _nice_max(max(p95 * 1000 for _, row in rows for _, p95 in row.curve
                        if p95 is not None))

    def x(rate: float) -> float:
        return _LEFT + plot_w * rate / right

    def y(ms: float) -> float:
        return _TOP + plot_h * (1 - ms / top)

    out = [(f'<svg id="capacity" xmlns="http://www.w3.org/2000/svg" width="{_W}" '
            f'height="{_H}" viewBox="0 0 {_W} {_H}" role="img" '
            'aria-label="TTFT p95 by request rate">')]
    for step in range(_STEPS + 1):
        ms, rate = top * step / _STEPS, right * step / _STEPS
        out.append(f'<line class="grid" x1="{_LEFT}" x2="{_LEFT + plot_w}" y1="{y(ms):.1f}" '
                   f'y2="{y(ms):.1f}"/>')
        out.append(f'<text x="{_LEFT - 6}" y="{y(ms) + 4:.1f}" text-anchor="end">{ms:g}</text>')
        out.append(f'<text x="{x(rate):.1f}" y="{_TOP + plot_h + 18}" '
                   f'text-anchor="middle">{rate:g}</text>')
    out.append(f'<line class="axis" x1="{_LEFT}" x2="{_LEFT}" y1="{_TOP}" '
               f'y2="{_TOP + plot_h}"/>')
    out.append(f'<line class="axis" x1="{_LEFT}" x2="{_LEFT + plot_w}" y1="{_TOP + plot_h}" '
               f'y2="{_TOP + plot_h}"/>')
    out.append(f'<text x="{_LEFT + plot_w / 2:.1f}" y="{_H - 8}" text-anchor="middle">'
               "offered requests/s (open loop)</text>")
    out.append(f'<text transform="translate(16 {_TOP + plot_h / 2:.1f}) rotate(-90)" '
               'text-anchor="middle">TTFT p95 ms</text>')
    for legend, (index, row) in enumerate(rows):
        colour = palette[index % len(palette)]
        label = html.escape(row.label, quote=True)
        points = [(rate, p95 * 1000) for rate, p95 in row.curve if p95 is not None]
        line = " ".join(f"{x(rate):.1f},{y(ms):.1f}" for rate, ms in points)
        out.append(f'<polyline class="series" data-digest="{html.escape(row.digest)}" '
                   f'fill="none" stroke="{colour}" stroke-width="2" points="{line}">'
                   f"<title>{label}</title></polyline>")
        out += [f'<circle cx="{x(rate):.1f}" cy="{y(ms):.1f}" r="3.5" fill="{colour}">'
                f"<title>{label}: {rate:g} requests/s, TTFT p95 {ms:.0f} ms</title></circle>"
                for rate, ms in points]
        ly, lx = _TOP + 10 + 20 * legend, _LEFT + plot_w + 16
        out.append(f'<g class="legend"><line x1="{lx}" x2="{lx + 20}" y1="{ly}" y2="{ly}" '
                   f'stroke="{colour}" stroke-width="3"/><text x="{lx + 26}" y="{ly + 4}">'
                   f"{html.escape(row.kind)} {html.escape(row.digest[7:15])}</text></g>")
    out.append("</svg>")
    return "\n".join(out)
