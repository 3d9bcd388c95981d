"""Compare: the side-by-side table of a model's ready artifacts, from our own smoke reports.

    comparison = compare(ctx, "llama-3.1-8b", gpu="h100")
    print(render_table(comparison))
    write_html(comparison, Path("compare.html"))   # pipeline.serving.compare_html

One row per ready servable artifact (`trtllm-engine`, `trtllm-checkpoint`, `vllm`), in resolve's
order: engines, then TRT-LLM PyTorch checkpoints, then vLLM entries; within a kind the higher
best throughput first, then the newer. Each row takes its latest *passing* smoke report: output
tokens/s and TTFT p50/p95 at each concurrency level, $ per 1M output tokens at the best level,
time to ready (cold start; and warm, from the latest passing smoke that started from a warm
cache, `pipeline.serving.warm`) — plus the build time (its stage run's finished_at -
started_at; None for imports) and its size. A ready artifact with no passing report
(imported with `--ready`) still gets a row, with no numbers and no line in the chart.

`gpu` keeps the artifacts whose GPU column is that SKU (any spelling registry.gpus knows) and
the ones with no GPU column (checkpoints and vLLM entries are not tied to a GPU), and takes
numbers only from smoke reports measured on that SKU (each report records where it ran): an
artifact smoked only elsewhere gets a row with no numbers, and the title says so. Without
`gpu`, each row's numbers are from its latest passing report wherever it ran, and the table
names that GPU.

`compare` reads the registry; `render_table` is pure. The HTML page (`render_html`,
`write_html`) is pipeline.serving.compare_html.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

from pipeline.serving.capacity import curve_from_dict
from registry.errors import RecordNotFoundError
from registry.gpus import lookup_gpu
from registry.ops.resolve import KIND_ORDER
from registry.sql import leases, records, smoke_records
from registry.sql.refit_evidence import equivalence_for

if TYPE_CHECKING:
    from registry.context import Context



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
    warm_ready_s: float | None = None  # the latest passing smoke that started from a warm cache
    warm_use: str | None = None  # what its runtime did with the cache ("used", "placed, not …")
    curve: tuple[tuple[float, float | None], ...] = ()  # (rate, TTFT p95 s) of its curve
    refit_equivalence: str | None = None  # a weight-stripped engine's evidence (its digest)

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
            "warm_ready_s": self.warm_ready_s, "warm_use": self.warm_use,
            "refit_equivalence": self.refit_equivalence,
            "best_output_tokens_per_s": self.best_output_tokens_per_s,
            "cost_per_million_tokens": self.cost_per_million_tokens,
            "price_per_hour": self.price_per_hour, "smoked_on": self.smoked_on,
            "load": [
                {"concurrency": lv.concurrency, "output_tokens_per_s": lv.output_tokens_per_s,
                 "ttft_p50_s": lv.ttft_p50_s, "ttft_p95_s": lv.ttft_p95_s, "errors": lv.errors}
                for lv in self.levels
            ],
            "capacity": [{"rate": rate, "ttft_p95_s": p95} for rate, p95 in self.curve],
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
        sku = lookup_gpu(gpu, option="--gpu").sku
    with ctx.registry.session(readonly=True) as session:
        found = [r for r in records.list_artifacts(session, model=model, status="ready")
                 if r.kind in KIND_ORDER and (sku is None or r.gpu in (None, sku))]
        runs = leases.get_stage_runs(session, {r.key for r in found if r.key})
        rows = []
        for record in found:
            passing = [s for s in smoke_records.smoke_reports(session, record.digest)
                       if s.passed and (sku is None or s.gpu == sku)]
            run = runs.get(record.key) if record.key else None
            build_s = (None if run is None or run.finished_at is None
                       else (run.finished_at - run.started_at).total_seconds())
            cold = [s for s in passing if not s.report.get("warm_cache")]
            warm = [s for s in passing if s.report.get("warm_cache")]
            row = _row(record, cold[-1] if cold else (passing[-1] if passing else None), build_s)
            if record.labels.get("strip_plan") is True:  # ready: its tuple's evidence holds
                proof = equivalence_for(session, model=record.model, quant=record.quant,
                                        gpu=record.gpu, trtllm=record.toolchain.get("trtllm"))
                row = replace(row, refit_equivalence=proof.digest if proof else None)
            rows.append(replace(row, warm_ready_s=_float(warm[-1].report.get("ready_s")),
                                warm_use=_text(warm[-1].report.get("warm_use")))
                        if warm else row)
    if not rows:
        where = f" on {sku}" if sku else ""
        raise RecordNotFoundError("ready artifact of", f"{model}{where}",
                                  hint=f"see `enginectl ls --model {model}`")
    rows.sort(key=_order)
    return Comparison(model, sku, tuple(rows))


def heading(comparison: Comparison) -> str:
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


def _row(record: records.ArtifactRecord, smoke: smoke_records.SmokeRecord | None,
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
        smoked_on=smoke.gpu if smoke else None, curve=_curve(report.get("capacity")),
    )


def _curve(value: object) -> tuple[tuple[float, float | None], ...]:
    """(rate, TTFT p95) of each point of a report's capacity curve (none: empty)."""
    found = curve_from_dict(value)
    return () if found is None else tuple((p.rate, p.ttft_p95_s) for p in found.points)


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


def number(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def ttft(level: Level | None) -> str:
    if level is None:
        return "-"
    return f"{number(level.ttft_p50_s, '.3f')}/{number(level.ttft_p95_s, '.3f')}"


def _warm(row: Row) -> str:
    """The WARM cell: its start, marked when the runtime did not use the cache it was given."""
    if row.warm_ready_s is None or row.warm_use in (None, "used"):
        return _seconds(row.warm_ready_s)
    return f"{_seconds(row.warm_ready_s)} (not used)"


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _cost(value: float | None) -> str:
    return "-" if value is None else f"${value:.2f}"


def summary_cells(row: Row) -> list[str]:
    return [row.kind, row.gpu or "-", row.quant or "-", str(row.tp), _size(row.size),
            _seconds(row.build_s), _seconds(row.ready_s), _warm(row),
            number(row.best_output_tokens_per_s, ".1f"), _cost(row.cost_per_million_tokens),
            row.smoked_on or ("-" if row.smoked_at is None else "unknown")]


SUMMARY_HEADER: Final = ("KIND", "GPU", "QUANT", "TP", "SIZE", "BUILD", "READY", "WARM",
                         "BEST TOK/S", "$/1M TOK", "SMOKED ON")


def _columns(lines: list[list[str]]) -> str:
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True))
                     .rstrip() for line in lines)


def render_table(comparison: Comparison) -> str:
    """The terminal table: one summary line per artifact, then tokens/s and TTFT p50/p95 at
    each concurrency level."""
    levels = comparison.concurrencies
    summary = [["DIGEST", *SUMMARY_HEADER]]
    summary += [[row.digest[7:19], *summary_cells(row)] for row in comparison.rows]
    title = heading(comparison)
    parts = [title, "", _columns(summary)]
    if levels:
        load = [["DIGEST", *(f"c={c} tok/s" for c in levels),
                 *(f"c={c} TTFT p50/p95 s" for c in levels)]]
        for row in comparison.rows:
            found = [row.level(c) for c in levels]
            load.append([row.digest[7:19],
                         *(number(lv.output_tokens_per_s if lv else None, ".1f")
                           for lv in found),
                         *(ttft(lv) for lv in found)])
        parts += ["", _columns(load)]
    stripped = [f"{row.digest[7:19]}: weight-stripped, refitted where it serves; "
                f"refit-equivalence {row.refit_equivalence[:19]} (identical greedy outputs, "
                "speed no worse than whole)" for row in comparison.rows if row.refit_equivalence]
    parts += ["", *stripped] if stripped else []
    if any(row.smoked_at is None for row in comparison.rows):
        parts += ["", "-: no passing smoke report (run `enginectl smoke DIGEST`)"]
    return "\n".join(parts)

