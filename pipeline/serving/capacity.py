"""Capacity curves, and the capacity an artifact has at a latency objective. Pure, no I/O.

A curve is what `pipeline.serving.openloop` measured: per offered request rate (Poisson
arrivals, open loop), TTFT p50/p95, TPOT p50/p95, the requests' end-to-end p50, the output
tokens/s delivered and the errors. It is stored in the smoke report (`SmokeReport.capacity`,
the `capacity` field of the report's JSON), so it is evidence like the rest: per artifact, GPU
SKU and fingerprint, in the registry and in the store's records.

`capacity_at` reads the highest rate at which an objective holds: the SLO holds at a measured
rate when that point and every lower one meets each ceiling it names with no errors. The
capacity is the last measured rate that held, never a rate read between it and the first that
broke: latency climbs ever more steeply toward saturation, so a straight line between the two
points crosses the ceiling too late (bench/advise_check.py measured the SLO broken at such a
reading), and never past a measured rate; when every point holds, the capacity is the highest
rate measured, said as a lower bound (`measured_limit`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Final, Literal

STOP_REASONS: Final = ("ttft", "tpot", "errors", "rates")
StopReason = Literal["ttft", "tpot", "errors", "rates"]


@dataclass(frozen=True, slots=True)
class RatePoint:
    """One offered rate of a curve: what the requests sent at that rate met."""

    rate: float  # offered requests/s
    sent: int
    completed: int
    errors: int
    duration_s: float  # the arrivals' window; the drain after it is not counted
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    tpot_p50_s: float | None
    tpot_p95_s: float | None
    latency_p50_s: float | None  # a request's whole time, send to the end of its stream
    output_tokens: int  # of the completed requests
    output_tokens_per_s: float  # those tokens over the first send to the last answer's end
    first_error: str | None = None

    @property
    def tokens_per_request(self) -> float | None:
        """Mean output tokens of a completed request (None: none completed)."""
        return self.output_tokens / self.completed if self.completed else None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Curve:
    """The measured points (ascending rate), the ceilings the measurement stopped at, and
    why it stopped: the TTFT or TPOT ceiling passed, requests failed, or the rates ran out."""

    points: tuple[RatePoint, ...]
    ttft_p95_ceiling_s: float
    tpot_p95_ceiling_s: float
    stopped: StopReason
    duration_s: float
    max_tokens: int

    def as_dict(self) -> dict[str, Any]:
        return {"points": [p.as_dict() for p in self.points],
                "ttft_p95_ceiling_s": self.ttft_p95_ceiling_s,
                "tpot_p95_ceiling_s": self.tpot_p95_ceiling_s, "stopped": self.stopped,
                "duration_s": self.duration_s, "max_tokens": self.max_tokens}


def curve_from_dict(value: object) -> Curve | None:
    """The curve a report's `capacity` field holds; None when it holds none or not one this
    reader knows (a report from before curves, or damaged): never an error."""
    if not isinstance(value, Mapping):
        return None
    try:
        points = tuple(_point(p) for p in value["points"])
        stopped = str(value["stopped"])
        if stopped not in STOP_REASONS:
            return None
        return Curve(points, float(value["ttft_p95_ceiling_s"]),
                     float(value["tpot_p95_ceiling_s"]), stopped,  # type: ignore[arg-type]
                     float(value["duration_s"]), int(value["max_tokens"]))
    except (KeyError, TypeError, ValueError):
        return None


def _point(value: Mapping[str, Any]) -> RatePoint:
    def number(name: str) -> float | None:
        found = value.get(name)
        return None if found is None else float(found)

    return RatePoint(
        rate=float(value["rate"]), sent=int(value["sent"]), completed=int(value["completed"]),
        errors=int(value["errors"]), duration_s=float(value["duration_s"]),
        ttft_p50_s=number("ttft_p50_s"), ttft_p95_s=number("ttft_p95_s"),
        tpot_p50_s=number("tpot_p50_s"), tpot_p95_s=number("tpot_p95_s"),
        latency_p50_s=number("latency_p50_s"), output_tokens=int(value["output_tokens"]),
        output_tokens_per_s=float(value.get("output_tokens_per_s") or 0.0),
        first_error=value.get("first_error"))


def stop_reason(point: RatePoint, ttft_ceiling_s: float, tpot_ceiling_s: float
                ) -> StopReason | None:
    """Why the measurement stops after *point* (None: go on to the next rate): more than
    a tenth of its requests failed, or its TTFT p95 or TPOT p95 passed its ceiling."""
    if point.errors * 10 > max(point.sent, 1) or not point.completed:
        return "errors"
    if point.ttft_p95_s is not None and point.ttft_p95_s > ttft_ceiling_s:
        return "ttft"
    if point.tpot_p95_s is not None and point.tpot_p95_s > tpot_ceiling_s:
        return "tpot"
    return None


# --- reading a capacity off a curve ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Slo:
    """A latency objective: TTFT p95 and optionally TPOT p95, in seconds."""

    ttft_p95_s: float
    tpot_p95_s: float | None = None

    def misses(self, point: RatePoint) -> list[str]:
        """What *point* misses of this objective, one phrase each (empty: it holds)."""
        found = []
        if point.errors or not point.completed:
            found.append(f"{point.errors}/{point.sent} requests failed")
        if point.ttft_p95_s is None or point.ttft_p95_s > self.ttft_p95_s:
            found.append(_over("TTFT", point.ttft_p95_s, self.ttft_p95_s))
        if self.tpot_p95_s is not None and (
                point.tpot_p95_s is None or point.tpot_p95_s > self.tpot_p95_s):
            found.append(_over("TPOT", point.tpot_p95_s, self.tpot_p95_s))
        return found

    def shortfall(self, point: RatePoint) -> float:
        """How far *point* is from this objective: its worst figure ÷ that ceiling − 1
        (infinite when it failed requests or a figure is missing)."""
        if point.errors or not point.completed or point.ttft_p95_s is None:
            return math.inf
        worst = point.ttft_p95_s / self.ttft_p95_s
        if self.tpot_p95_s is not None:
            if point.tpot_p95_s is None:
                return math.inf
            worst = max(worst, point.tpot_p95_s / self.tpot_p95_s)
        return worst - 1

    def as_dict(self) -> dict[str, Any]:
        return {"ttft_p95_s": self.ttft_p95_s, "tpot_p95_s": self.tpot_p95_s}


def _over(name: str, got: float | None, limit: float) -> str:
    if got is None:
        return f"{name} p95 not measured"
    return (f"{name} p95 {got * 1000:.0f} ms is {(got - limit) * 1000:.0f} ms over "
            f"{limit * 1000:.0f} ms")


@dataclass(frozen=True, slots=True)
class Capacity:
    """The requests/s an artifact sustains within an objective, read off its curve (None
    when even its lowest measured rate misses it: *missed* says by how much), and the
    measured figures at that rate."""

    rate: float | None
    measured_limit: bool = False  # every measured point held: a lower bound
    ttft_p95_s: float | None = None
    tpot_p95_s: float | None = None
    latency_p50_s: float | None = None
    tokens_per_request: float | None = None
    missed: tuple[str, ...] = field(default=())  # at the lowest rate, when rate is None
    lowest_rate: float | None = None
    shortfall: float | None = None  # when rate is None: the worst figure ÷ its ceiling − 1


def capacity_at(curve: Curve, slo: Slo) -> Capacity:
    """The capacity of *curve* at *slo* (module doc)."""
    held: RatePoint | None = None
    broke: RatePoint | None = None
    for point in curve.points:
        if slo.misses(point):
            broke = point
            break
        held = point
    if held is None:
        lowest = curve.points[0] if curve.points else None
        return Capacity(None, missed=tuple(slo.misses(lowest)) if lowest else
                        ("no rate was measured",),
                        lowest_rate=lowest.rate if lowest else None,
                        shortfall=None if lowest is None else slo.shortfall(lowest))
    return Capacity(
        held.rate, measured_limit=broke is None and curve.stopped == "rates",
        ttft_p95_s=held.ttft_p95_s, tpot_p95_s=held.tpot_p95_s,
        latency_p50_s=held.latency_p50_s, tokens_per_request=held.tokens_per_request,
        lowest_rate=curve.points[0].rate)
