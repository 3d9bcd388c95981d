"""Compare: the side-by-side table of a model's ready artifacts, from our own smoke reports.

    comparison = compare(ctx, "llama-3.1-8b", gpu="h100")
    print(render_table(comparison))
    write_html(comparison, Path("compare.html"))   # one self-contained page, no network

One row per ready servable artifact (`trtllm-engine`, `trtllm-checkpoint`, `vllm`), in resolve's
order: engines, then TRT-LLM PyTorch checkpoints, then vLLM entries; within a kind the higher
best throughput first, then the newer. Each row takes its latest *passing* smoke report: output
tokens/s and TTFT p50/p95 at each concurrency level, $ per 1M output tokens at the best level,
time to ready (cold start) — plus the build time (its stage run's finished_at - started_at; None
for imports) and its size. A ready artifact with no passing report (imported with `--ready`)
still gets a row, with no numbers and no line in the chart.

`gpu` keeps the artifacts whose GPU column is that SKU (any spelling registry.gpus knows) and
the ones with no GPU column (checkpoints and vLLM entries are not tied to a GPU), and takes
numbers only from smoke reports measured on that SKU (each report records where it ran): an
artifact smoked only elsewhere gets a row with no numbers, and the title says so. Without
`gpu`, each row's numbers are from its latest passing report wherever it ran, and the table
names that GPU.

`compare` reads the registry; `render_table` and `render_html` are pure; `write_html` writes
the page atomically (a temporary file renamed over the target).
"""

from __future__ import annotations

import html
import math
import os
import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from registry import records
from registry.errors import RecordNotFoundError, UsageError
from registry.gpus import UnknownGpuError, lookup_gpu
from registry.resolve import KIND_ORDER

if TYPE_CHECKING:
    from registry.context import Context

# Line colours of the chart, one per artifact (cycled); readable on white and by most
# colour-blind readers (Okabe-Ito).
PALETTE: Final = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9",
                  "#F0E442", "#000000")


@dataclass(frozen=True, slots=True)
class Level:
    """One concurrency level of a smoke report's load."""

    concurrency: int
    output_tokens_per_s: float
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    errors: int


@dataclass(frozen=True, slots=True)
class Row:
    digest: str
    kind: str
    gpu: str | None
    quant: str | None
    tp: int
    size: int
    created_at: datetime | None
    build_s: float | None  # stage run finished_at - started_at; None for imports
    smoked_at: datetime | None  # of the latest passing smoke report; None: no numbers
    ready_s: float | None
    best_output_tokens_per_s: float | None
    cost_per_million_tokens: float | None
    price_per_hour: float | None
    levels: tuple[Level, ...] = ()
    smoked_on: str | None = None  # the GPU SKU (or "CPU") its report ran on; None: unknown

    @property
    def label(self) -> str:
        """`trtllm-engine H100-SXM5-80GB fp8 tp2 1a2b3c4d5e6f`"""
        parts = [self.kind, self.gpu or "", self.quant or "", f"tp{self.tp}", self.digest[7:19]]
        return " ".join(part for part in parts if part)

    def level(self, concurrency: int) -> Level | None:
        return next((lv for lv in self.levels if lv.concurrency == concurrency), None)

    def as_dict(self) -> dict[str, Any]:
        return {
            "digest": self.digest, "kind": self.kind, "gpu": self.gpu, "quant": self.quant,
            "tp": self.tp, "size": self.size, "label": self.label,
            "created_at": _iso(self.created_at), "build_s": self.build_s,
            "smoked_at": _iso(self.smoked_at), "ready_s": self.ready_s,
            "best_output_tokens_per_s": self.best_output_tokens_per_s,
            "cost_per_million_tokens": self.cost_per_million_tokens,
            "price_per_hour": self.price_per_hour, "smoked_on": self.smoked_on,
            "load": [
                {"concurrency": lv.concurrency, "output_tokens_per_s": lv.output_tokens_per_s,
                 "ttft_p50_s": lv.ttft_p50_s, "ttft_p95_s": lv.ttft_p95_s, "errors": lv.errors}
                for lv in self.levels
            ],
        }


@dataclass(frozen=True, slots=True)
class Comparison:
    model: str
    gpu: str | None  # the canonical SKU filtered on, if any
    rows: tuple[Row, ...]

    @property
    def concurrencies(self) -> list[int]:
        """Every concurrency level any row was measured at, ascending."""
        return sorted({lv.concurrency for row in self.rows for lv in row.levels})

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "gpu": self.gpu, "concurrency": self.concurrencies,
                "rows": [row.as_dict() for row in self.rows]}


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def compare(ctx: Context, model: str, gpu: str | None = None) -> Comparison:
    """The ready artifacts of *model* (on *gpu*, see the module doc), side by side."""
    sku = None
    if gpu is not None:
        try:
            sku = lookup_gpu(gpu).sku
        except UnknownGpuError as exc:
            raise UsageError(f"--gpu: {exc}") from exc
    with ctx.registry.session(readonly=True) as session:
        found = [r for r in records.list_artifacts(session, model=model, status="ready")
                 if r.kind in KIND_ORDER and (sku is None or r.gpu in (None, sku))]
        runs = records.get_stage_runs(session, {r.key for r in found if r.key})
        rows = []
        for record in found:
            passing = [s for s in records.smoke_reports(session, record.digest)
                       if s.passed and (sku is None or s.gpu == sku)]
            run = runs.get(record.key) if record.key else None
            build_s = (None if run is None or run.finished_at is None
                       else (run.finished_at - run.started_at).total_seconds())
            rows.append(_row(record, passing[-1] if passing else None, build_s))
    if not rows:
        where = f" on {sku}" if sku else ""
        raise RecordNotFoundError("ready artifact of", f"{model}{where}",
                                  hint=f"see `enginectl ls --model {model}`")
    rows.sort(key=_order)
    return Comparison(model, sku, tuple(rows))


def _title(comparison: Comparison) -> str:
    """`m on H100-SXM5-80GB: smoke evidence measured on H100-SXM5-80GB only`"""
    if comparison.gpu is None:
        return comparison.model
    return (f"{comparison.model} on {comparison.gpu}: smoke evidence measured on "
            f"{comparison.gpu} only")


def _order(row: Row) -> tuple[int, float, float]:
    best = row.best_output_tokens_per_s
    created = row.created_at.timestamp() if row.created_at else 0.0
    return KIND_ORDER.index(row.kind), -(best if best is not None else -1.0), -created


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _row(record: records.ArtifactRecord, smoke: records.SmokeReport | None,
         build_s: float | None) -> Row:
    report = smoke.report if smoke else {}
    levels = tuple(sorted(
        (Level(int(lv["concurrency"]), _float(lv.get("output_tokens_per_s")) or 0.0,
               _float(lv.get("ttft_p50_s")), _float(lv.get("ttft_p95_s")),
               int(lv.get("errors") or 0))
         for lv in report.get("load") or []),
        key=lambda lv: lv.concurrency,
    ))
    return Row(
        digest=record.digest, kind=record.kind, gpu=record.gpu, quant=record.quant,
        tp=record.tp, size=record.size, created_at=record.created_at, build_s=build_s,
        smoked_at=smoke.created_at if smoke else None, ready_s=_float(report.get("ready_s")),
        best_output_tokens_per_s=_float(report.get("best_output_tokens_per_s")),
        cost_per_million_tokens=_float(report.get("cost_per_million_tokens")),
        price_per_hour=_float(report.get("price_per_hour")), levels=levels,
        smoked_on=smoke.gpu if smoke else None,
    )


# --- formatting ------------------------------------------------------------------------------


def _size(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 120:  # under two minutes reads best in seconds
        return f"{value:.1f}s"
    minutes, seconds = divmod(round(value), 60)
    return f"{minutes}m{seconds:02d}s"


def _number(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _ttft(level: Level | None) -> str:
    if level is None:
        return "-"
    return f"{_number(level.ttft_p50_s, '.3f')}/{_number(level.ttft_p95_s, '.3f')}"


def _cost(value: float | None) -> str:
    return "-" if value is None else f"${value:.2f}"


def _summary(row: Row) -> list[str]:
    return [row.kind, row.gpu or "-", row.quant or "-", str(row.tp), _size(row.size),
            _seconds(row.build_s), _seconds(row.ready_s),
            _number(row.best_output_tokens_per_s, ".1f"), _cost(row.cost_per_million_tokens),
            row.smoked_on or ("-" if row.smoked_at is None else "unknown")]


SUMMARY_HEADER: Final = ("KIND", "GPU", "QUANT", "TP", "SIZE", "BUILD", "READY", "BEST TOK/S",
                         "$/1M TOK", "SMOKED ON")


def _columns(lines: list[list[str]]) -> str:
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True))
                     .rstrip() for line in lines)


def render_table(comparison: Comparison) -> str:
    """The terminal table: one summary line per artifact, then tokens/s and TTFT p50/p95 at
    each concurrency level."""
    levels = comparison.concurrencies
    summary = [["DIGEST", *SUMMARY_HEADER]]
    summary += [[row.digest[7:19], *_summary(row)] for row in comparison.rows]
    title = _title(comparison)
    parts = [title, "", _columns(summary)]
    if levels:
        load = [["DIGEST", *(f"c={c} tok/s" for c in levels),
                 *(f"c={c} TTFT p50/p95 s" for c in levels)]]
        for row in comparison.rows:
            found = [row.level(c) for c in levels]
            load.append([row.digest[7:19],
                         *(_number(lv.output_tokens_per_s if lv else None, ".1f")
                           for lv in found),
                         *(_ttft(lv) for lv in found)])
        parts += ["", _columns(load)]
    if any(row.smoked_at is None for row in comparison.rows):
        parts += ["", "-: no passing smoke report (run `enginectl smoke DIGEST`)"]
    return "\n".join(parts)


# --- HTML ------------------------------------------------------------------------------------

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


def _e(value: object) -> str:
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
        out.append(f'<polyline class="series" data-digest="{_e(row.digest)}" fill="none" '
                   f'stroke="{colour}" stroke-width="2" points="{points}">'
                   f"<title>{_e(row.label)}</title></polyline>")
        for lv in row.levels:
            out.append(f'<circle cx="{x(lv.concurrency):.1f}" cy="{y(lv.output_tokens_per_s):.1f}"'
                       f' r="3.5" fill="{colour}"><title>{_e(row.label)}: c={lv.concurrency}, '
                       f"{lv.output_tokens_per_s:.1f} tok/s</title></circle>")
        ly = _TOP + 10 + 20 * legend
        lx = _LEFT + plot_w + 16
        out.append(f'<g class="legend"><line x1="{lx}" x2="{lx + 20}" y1="{ly}" y2="{ly}" '
                   f'stroke="{colour}" stroke-width="3"/><text x="{lx + 26}" y="{ly + 4}">'
                   f"{_e(row.kind)} {_e(row.quant or '')} {_e(row.digest[7:15])}</text></g>")
        legend += 1
    out.append("</svg>")
    return "\n".join(out)


def render_html(comparison: Comparison) -> str:
    """One self-contained page: the tables and an inline SVG chart of throughput against
    concurrency, one line per artifact. No scripts, fonts or URLs: it renders offline."""
    levels = comparison.concurrencies
    title = _title(comparison)
    head = "".join(f"<th>{_e(h)}</th>" for h in SUMMARY_HEADER)
    head += "".join(f"<th>c={c}<br><small>tok/s<br>TTFT p50/p95 s</small></th>" for c in levels)
    body = []
    for index, row in enumerate(comparison.rows):
        swatch = PALETTE[index % len(PALETTE)] if row.levels else "transparent"
        found = [row.level(c) for c in levels]
        cells = "".join(f"<td>{_e(cell)}</td>" for cell in _summary(row))
        cells += "".join(
            f"<td>{_e(_number(lv.output_tokens_per_s if lv else None, '.1f'))}<br>"
            f"<small>{_e(_ttft(lv))}</small></td>" for lv in found)
        body.append(f'<tr class="artifact" data-digest="{_e(row.digest)}"><td class="label">'
                    f'<span class="swatch" style="background:{swatch}"></span>'
                    f"{_e(row.digest[7:19])}</td>{cells}</tr>")
    note = ("Output tokens/s, time to first token and $ per 1M output tokens from each "
            "artifact's latest passing smoke report; build time from its stage run; "
            "ready is the cold start. A dash means not measured.")
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>enginectl compare: {_e(title)}</title>",
        f"<style>{PAGE_CSS}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
        f'<p class="note">{_e(note)}</p>',
        '<div class="wide"><table id="compare">',
        f'<thead><tr><th class="label">artifact</th>{head}</tr></thead>',
        "<tbody>", *body, "</tbody></table></div>",
        _chart(comparison) if levels else "<p>No passing smoke report to chart.</p>",
        "</body></html>",
        "",
    ])


def write_html(comparison: Comparison, path: Path | str) -> Path:
    """Write `render_html(comparison)` to *path* atomically; the absolute path written."""
    path = Path(path).resolve()
    if not path.parent.is_dir():
        raise UsageError(f"--html {path}: directory {path.parent} does not exist")
    text = render_html(comparison)
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
