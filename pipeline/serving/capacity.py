"""Capacity curves, and the capacity an artifact has at a latency objective. Pure, no I/O.

A curve is what `pipeline.serving.openloop` measured: per offered request rate (Poisson
arrivals, open loop), TTFT p50/p95, TPOT p50/p95, the requests' end-to-end p50, the output
tokens/s delivered and the errors. It is stored in the smoke report (`SmokeReport.capacity`,
the `capacity` field of the report's JSON), so it is evidence like the rest: per artifact, GPU
SKU and fingerprint, in the registry and in the store's records.

The rates are measured in *rounds*, interleaved: each round goes up the rates, lowest first,
until one of its points passes a ceiling, then the next round starts again from the lowest
(so a neighbour's burst of load falls on one round of a few rates, not on every sample of one
rate). A curve point is its rate's rounds combined (`combined`): the p95s, the p50s, request
time and tokens/s the median round's, the counts summed; the rounds themselves are kept in the
point (`RatePoint.rounds`, the JSON's `rounds`). A report from before rounds holds one sample
per rate: one round.

`capacity_at` reads the highest rate at which an objective holds. A rate *holds* when more
than half of the curve's rounds met each ceiling the objective names there (the median round,
the rule the A/B gate and bench/advise_check.py decide by; a round that never reached the
rate, having passed a ceiling below it, did not) and no request failed there in any round
(failures are not noise). The capacity is the highest rate that held in *every* round, with
every rate below it holding: one slow round at a lower rate does not cap the reading, and
the rate advised is one the objective met with the curve's whole spread, not by a median at
the edge (on a quiet machine, the rate whose median p95 was 248 ms against 250 measured 256–595
ms in the check). The capacity is the last measured rate that held, never a rate read between
it and the first that broke: latency climbs ever more steeply toward saturation, so a straight
line between the two points crosses the ceiling too late (bench/advise_check.py measured the
SLO broken at such a reading), and never past a measured rate; when the highest rate measured
held, the capacity is that rate, said as a lower bound (`measured_limit`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
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
    rounds: tuple[RatePoint, ...] = ()  # the rounds combined into this point (`combined`)

    @property
    def tokens_per_request(self) -> float | None:
        """Mean output tokens of a completed request (None: none completed)."""
        return self.output_tokens / self.completed if self.completed else None

    @property
    def samples(self) -> tuple[RatePoint, ...]:
        """Each round's own point at this rate, in round order (one: the point itself)."""
        return self.rounds or (self,)

    def as_dict(self) -> dict[str, Any]:
        found = asdict(replace(self, rounds=()))
        del found["rounds"]
        if self.rounds:
            found["rounds"] = [sample.as_dict() for sample in self.rounds]
        return found


def combined(samples: Sequence[RatePoint]) -> RatePoint:
    """One rate's rounds as one point: the p95s, the p50s, the request p50 time and tokens/s
    the median round's (the figures `capacity_at` decides by), the counts and windows summed,
    the first error the first round's that had one. One sample is returned as it is."""
    if len(samples) == 1:
        return samples[0]

    def middle(values: Sequence[float | None]) -> float | None:
        found = [v for v in values if v is not None]
        return statistics.median(found) if found else None

    first = samples[0]
    return RatePoint(
        rate=first.rate, sent=sum(s.sent for s in samples),
        completed=sum(s.completed for s in samples), errors=sum(s.errors for s in samples),
        duration_s=sum(s.duration_s for s in samples),
        ttft_p50_s=middle([s.ttft_p50_s for s in samples]),
        ttft_p95_s=middle([s.ttft_p95_s for s in samples]),
        tpot_p50_s=middle([s.tpot_p50_s for s in samples]),
        tpot_p95_s=middle([s.tpot_p95_s for s in samples]),
        latency_p50_s=middle([s.latency_p50_s for s in samples]),
        output_tokens=sum(s.output_tokens for s in samples),
        output_tokens_per_s=statistics.median(s.output_tokens_per_s for s in samples),
        first_error=next((s.first_error for s in samples if s.first_error), None),
        rounds=tuple(samples))


@dataclass(frozen=True, slots=True)
class Curve:
    """The measured points (ascending rate, each its rounds combined), the ceilings the
    measurement stopped at, why it stopped (the TTFT or TPOT ceiling passed, requests failed,
    or the rates ran out: the reason of the round that stopped lowest), and how many rounds
    it ran."""

    points: tuple[RatePoint, ...]
    ttft_p95_ceiling_s: float
    tpot_p95_ceiling_s: float
    stopped: StopReason
    duration_s: float  # of each rate in each round
    max_tokens: int
    rounds: int = 1

    def as_dict(self) -> dict[str, Any]:
        return {"points": [p.as_dict() for p in self.points],
                "ttft_p95_ceiling_s": self.ttft_p95_ceiling_s,
                "tpot_p95_ceiling_s": self.tpot_p95_ceiling_s, "stopped": self.stopped,
                "duration_s": self.duration_s, "max_tokens": self.max_tokens,
                "rounds": self.rounds}


def curve_of_rounds(rounds: Sequence[tuple[Sequence[RatePoint], StopReason]], *,
                    ttft_p95_ceiling_s: float, tpot_p95_ceiling_s: float, duration_s: float,
                    max_tokens: int) -> Curve:
    """The curve of *rounds*, each the points one round measured (ascending rate) and why it
    stopped: the points of each rate combined (`combined`), in round order."""
    by_rate: dict[float, list[RatePoint]] = {}
    for points, _ in rounds:
        for point in points:
            by_rate.setdefault(point.rate, []).append(point)
    stops = [(len(points), reason) for points, reason in rounds if reason != "rates"]
    stopped: StopReason = min(stops, key=lambda stop: stop[0])[1] if stops else "rates"
    return Curve(tuple(combined(by_rate[rate]) for rate in sorted(by_rate)),
                 ttft_p95_ceiling_s, tpot_p95_ceiling_s, stopped, duration_s, max_tokens,
                 max(len(rounds), 1))


def curve_from_dict(value: object) -> Curve | None:
    """The curve a report's `capacity` field holds; None when it holds none or not one this
    reader knows (a report from before curves, or damaged): never an error. A report from
    before rounds (no `rounds`) reads as one round."""
    if not isinstance(value, Mapping):
        return None
    try:
        points = tuple(_point(p) for p in value["points"])
        stopped = str(value["stopped"])
        rounds = int(value.get("rounds", 1))
        if stopped not in STOP_REASONS or rounds < 1:
            return None
        return Curve(points, float(value["ttft_p95_ceiling_s"]),
                     float(value["tpot_p95_ceiling_s"]), stopped,  # type: ignore[arg-type]
                     float(value["duration_s"]), int(value["max_tokens"]), rounds)
    except (KeyError, TypeError, ValueError):
        return None


def _point(value: object) -> RatePoint:
    if not isinstance(value, Mapping):
        raise TypeError("a point is not a mapping")

    def number(name: str) -> float | None:
        found = value.get(name)
        return None if found is None else float(found)

    rounds = value.get("rounds") or ()
    if not isinstance(rounds, list | tuple):
        raise TypeError("rounds is not a list")
    return RatePoint(
        rate=float(value["rate"]), sent=int(value["sent"]), completed=int(value["completed"]),
        errors=int(value["errors"]), duration_s=float(value["duration_s"]),
        ttft_p50_s=number("ttft_p50_s"), ttft_p95_s=number("ttft_p95_s"),
        tpot_p50_s=number("tpot_p50_s"), tpot_p95_s=number("tpot_p95_s"),
        latency_p50_s=number("latency_p50_s"), output_tokens=int(value["output_tokens"]),
        output_tokens_per_s=float(value.get("output_tokens_per_s") or 0.0),
        first_error=value.get("first_error"),
        rounds=tuple(_point(sample) for sample in rounds))


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

    def misses(self, point: RatePoint, rounds: int = 1) -> list[str]:
        """What *point*, combined from its rounds, misses of this objective (module doc: more
        than half of the curve's *rounds* met it there, and no request failed), one phrase
        each; empty: it held."""
        samples = point.samples
        counted = max(rounds, len(samples))
        met = sum(1 for sample in samples if not self._misses_once(sample))
        if met * 2 > counted and not point.errors:
            return []
        if counted == 1:
            return self._misses_once(point)
        found = []
        if len(samples) < rounds:
            found.append(f"reached in {len(samples)} of {rounds} rounds (the others passed a "
                         "ceiling below it)")
        if point.errors or not point.completed:
            found.append(f"{point.errors}/{point.sent} requests failed")
        median = f" (the median of {len(samples)} rounds)" if len(samples) > 1 else ""
        if point.ttft_p95_s is None or point.ttft_p95_s > self.ttft_p95_s:
            found.append(_over("TTFT", point.ttft_p95_s, self.ttft_p95_s) + median)
        if self.tpot_p95_s is not None and (
                point.tpot_p95_s is None or point.tpot_p95_s > self.tpot_p95_s):
            found.append(_over("TPOT", point.tpot_p95_s, self.tpot_p95_s) + median)
        if not found:  # the median round held, yet not more than half of the rounds did
            missed = [sample for sample in samples if self._misses_once(sample)]
            slowest = max(missed, key=self.shortfall)
            found.append(f"{'; '.join(self._misses_once(slowest))} in one of {counted} rounds, "
                         f"met in {met}: not more than half")
        return found

    def misses_in_a_round(self, point: RatePoint, rounds: int = 1) -> list[str]:
        """What *point* misses of this objective in any one of the curve's *rounds* (a round
        that never reached it counts), one phrase each, the slowest round's figures; empty:
        every round met it, the test the capacity's own rate must pass (module doc)."""
        found = []
        if len(point.samples) < rounds:
            found.append(f"reached in {len(point.samples)} of {rounds} rounds (the others "
                         "passed a ceiling below it)")
        missed = [sample for sample in point.samples if self._misses_once(sample)]
        if missed:
            slowest = max(missed, key=self.shortfall)
            where = f" in {len(missed)} of {max(rounds, len(point.samples))} rounds" \
                if max(rounds, len(point.samples)) > 1 else ""
            found += [phrase + where for phrase in self._misses_once(slowest)]
        return found

    def _misses_once(self, point: RatePoint) -> list[str]:
        """What one round's *point* misses: failed requests, a p95 over its ceiling."""
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
    measured_limit: bool = False  # the highest rate measured held: a lower bound
    ttft_p95_s: float | None = None
    tpot_p95_s: float | None = None
    latency_p50_s: float | None = None
    tokens_per_request: float | None = None
    missed: tuple[str, ...] = field(default=())  # at the lowest rate, when rate is None
    lowest_rate: float | None = None
    shortfall: float | None = None  # when rate is None: the worst figure ÷ its ceiling − 1
    rounds: int = 1  # the rounds each rate was measured in


def capacity_at(curve: Curve, slo: Slo) -> Capacity:
    """The capacity of *curve* at *slo* (module doc)."""
    held: RatePoint | None = None
    for point in curve.points:
        if slo.misses(point, curve.rounds):
            break
        if not slo.misses_in_a_round(point, curve.rounds):
            held = point
    if held is None:
        lowest = curve.points[0] if curve.points else None
        if lowest is None:
            return Capacity(None, missed=("no rate was measured",), rounds=curve.rounds)
        missed = slo.misses(lowest, curve.rounds) or slo.misses_in_a_round(lowest, curve.rounds)
        return Capacity(None, missed=tuple(missed), lowest_rate=lowest.rate,
                        shortfall=max(slo.shortfall(sample) for sample in lowest.samples),
                        rounds=curve.rounds)
    return Capacity(
        held.rate, measured_limit=held is curve.points[-1] and curve.stopped == "rates",
        ttft_p95_s=held.ttft_p95_s, tpot_p95_s=held.tpot_p95_s,
        latency_p50_s=held.latency_p50_s, tokens_per_request=held.tokens_per_request,
        lowest_rate=curve.points[0].rate, rounds=curve.rounds)
