"""Capacity at an objective, read off a curve; replicas and costs; the advice's ranking and
proof selection; the SLO inputs as written. Pure."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pipeline.advise.decide import costs, decide, plan_replicas
from pipeline.advise.inputs import parse_duration, parse_prices, parse_rate
from pipeline.serving.capacity import (
    Curve,
    RatePoint,
    Slo,
    capacity_at,
    combined,
    curve_from_dict,
    curve_of_rounds,
)
from registry.errors import UsageError
from registry.sql.curve_records import CurveProof

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def point(rate: float, ttft: float, tpot: float = 0.02, *, errors: int = 0,
          latency: float = 1.0) -> RatePoint:
    sent = max(1, int(rate * 10))
    return RatePoint(rate=rate, sent=sent, completed=sent - errors, errors=errors,
                     duration_s=10.0, ttft_p50_s=ttft / 2, ttft_p95_s=ttft, tpot_p50_s=tpot,
                     tpot_p95_s=tpot, latency_p50_s=latency, output_tokens=32 * (sent - errors),
                     output_tokens_per_s=32.0 * rate)


def curve(*points: RatePoint, stopped: str = "ttft") -> Curve:
    return Curve(tuple(points), 2.0, 0.2, stopped, 10.0, 32)  # type: ignore[arg-type]


def test_capacity_is_the_last_measured_rate_that_held_never_one_read_between_points() -> None:
    """Latency climbs ever more steeply toward saturation: a straight line from 2/s (200 ms)
    to 4/s (500 ms) would promise 300 ms at 2.67/s, which a real server misses."""
    found = capacity_at(curve(point(1, 0.1), point(2, 0.2), point(4, 0.5)), Slo(0.3))
    assert found.rate == 2
    assert found.ttft_p95_s == pytest.approx(0.2)
    assert not found.measured_limit
    assert found.tokens_per_request == 32


def test_tpot_can_be_the_ceiling_that_binds() -> None:
    found = capacity_at(curve(point(1, 0.1, 0.01), point(2, 0.15, 0.09)), Slo(0.3, 0.05))
    assert found.rate == 1


def test_capacity_is_never_extrapolated_past_the_highest_rate_measured() -> None:
    found = capacity_at(curve(point(1, 0.1), point(2, 0.12), stopped="rates"), Slo(0.3))
    assert found.rate == 2
    assert found.measured_limit


def test_a_point_with_failed_requests_breaks_the_objective_at_the_last_good_rate() -> None:
    found = capacity_at(curve(point(1, 0.1), point(2, 0.1, errors=3)), Slo(0.3))
    assert found.rate == 1


def test_a_point_that_holds_after_one_that_broke_does_not_count() -> None:
    found = capacity_at(curve(point(1, 0.1), point(2, 0.5), point(4, 0.1)), Slo(0.3))
    assert found.rate == 1


def test_missing_even_the_lowest_rate_says_by_how_much() -> None:
    found = capacity_at(curve(point(1, 0.42)), Slo(0.3))
    assert found.rate is None
    assert found.missed == ("TTFT p95 420 ms is 120 ms over 300 ms",)
    assert found.shortfall == pytest.approx(0.4)


def test_a_curve_reads_back_from_its_json_and_junk_reads_as_none() -> None:
    made = curve(point(1, 0.1), point(2, 0.4))
    assert curve_from_dict(made.as_dict()) == made
    assert curve_from_dict(None) is None
    assert curve_from_dict({"points": "x"}) is None
    assert curve_from_dict({**made.as_dict(), "stopped": "bored"}) is None


def rounds_curve(*rounds: list[RatePoint], stops: tuple[str, ...] = ()) -> Curve:
    """A curve of *rounds* (each a round's points), each stopped by its entry in *stops*
    (default: the TTFT ceiling)."""
    reasons = stops or ("ttft",) * len(rounds)
    return curve_of_rounds(list(zip(rounds, reasons, strict=True)),  # type: ignore[arg-type]
                           ttft_p95_ceiling_s=2.0, tpot_p95_ceiling_s=0.2, duration_s=10.0,
                           max_tokens=32)


def test_a_rates_rounds_combine_into_their_median_round() -> None:
    found = combined([point(4, 0.2, 0.03), point(4, 0.6, 0.01), point(4, 0.1, 0.02)])
    assert found.rate == 4
    assert found.ttft_p95_s == pytest.approx(0.2)  # the median round's (0.2, 0.6, 0.1)
    assert found.tpot_p95_s == pytest.approx(0.02)
    assert found.ttft_p50_s == pytest.approx(0.1)  # the median round's (0.05, 0.3, 0.1)
    assert (found.sent, found.completed, found.duration_s) == (120, 120, 30.0)
    assert found.tokens_per_request == 32
    assert [s.ttft_p95_s for s in found.samples] == [0.2, 0.6, 0.1]
    lone = point(4, 0.2)
    assert combined([lone]) is lone
    assert lone.samples == (lone,)


def test_capacity_is_a_rate_held_in_every_round_with_every_lower_rate_held_by_most() -> None:
    """A burst in one round at 2/s does not cap the reading (two of three held there); 8/s
    held by the median but not in the second round, so it is not advised; 16/s broke in
    two of three: 4/s, where every round held."""
    found = capacity_at(rounds_curve(
        [point(2, 0.1), point(4, 0.2), point(8, 0.25), point(16, 0.9)],
        [point(2, 0.5), point(4, 0.25), point(8, 0.4), point(16, 0.2)],
        [point(2, 0.1), point(4, 0.1), point(8, 0.2), point(16, 0.8)]), Slo(0.3))
    assert found.rate == 4
    assert found.ttft_p95_s == pytest.approx(0.2)  # the median round at 4/s
    assert found.rounds == 3
    assert Slo(0.3).misses_in_a_round(point(8, 0.4), 3) == [
        "reached in 1 of 3 rounds (the others passed a ceiling below it)",
        "TTFT p95 400 ms is 100 ms over 300 ms in 1 of 3 rounds"]


def test_two_slow_rounds_of_three_break_a_rate_and_every_rate_above_it() -> None:
    made = rounds_curve(
        [point(2, 0.1), point(4, 0.35), point(8, 0.2)],
        [point(2, 0.1), point(4, 0.4), point(8, 0.2)],
        [point(2, 0.1), point(4, 0.1), point(8, 0.2)], stops=("rates",) * 3)
    assert capacity_at(made, Slo(0.3)).rate == 2  # 8/s held, but 4/s below it broke
    assert Slo(0.3).misses(made.points[1], made.rounds) == [
        "TTFT p95 350 ms is 50 ms over 300 ms (the median of 3 rounds)"]


def test_a_failed_request_in_any_round_breaks_the_rate() -> None:
    """Failures are not noise: two clean rounds do not outvote one with a failed request."""
    failed = point(4, 0.1, errors=1)
    made = rounds_curve([point(2, 0.1), point(4, 0.1)], [point(2, 0.1), failed],
                        [point(2, 0.1), point(4, 0.1)], stops=("rates",) * 3)
    assert capacity_at(made, Slo(0.3)).rate == 2
    assert Slo(0.3).misses(made.points[1], made.rounds) == ["1/120 requests failed"]


def test_a_rate_that_only_some_rounds_reached_counts_them_as_not_held() -> None:
    """The second round passed the curve's ceiling at 4/s and never sent 8/s: 8/s held by
    the median (two of three rounds) but not in every round, so it is not the capacity; had
    one of those two been slow, it would not even hold."""
    made = rounds_curve([point(2, 0.1), point(4, 0.2), point(8, 0.2)],
                        [point(2, 0.1), point(4, 2.5)],
                        [point(2, 0.1), point(4, 0.2), point(8, 0.2)],
                        stops=("rates", "ttft", "rates"))
    assert made.stopped == "ttft"
    assert [len(p.samples) for p in made.points] == [3, 3, 2]
    assert capacity_at(made, Slo(3.0)).rate == 4  # held in every round; 8/s in two of three
    slow = rounds_curve([point(2, 0.1), point(4, 0.2), point(8, 0.2)],
                        [point(2, 0.1), point(4, 2.5)],
                        [point(2, 0.1), point(4, 0.2), point(8, 2.9)],
                        stops=("rates", "ttft", "rates"))
    assert capacity_at(slow, Slo(1.0)).rate == 2  # 4/s held by the median, not in round 2
    assert Slo(1.0).misses(slow.points[2], slow.rounds) == [
        "reached in 2 of 3 rounds (the others passed a ceiling below it)",
        "TTFT p95 1550 ms is 550 ms over 1000 ms (the median of 2 rounds)"]


def test_every_round_running_out_of_rates_is_a_lower_bound() -> None:
    made = rounds_curve([point(1, 0.1), point(2, 0.1)], [point(1, 0.1), point(2, 0.2)],
                        stops=("rates", "rates"))
    found = capacity_at(made, Slo(0.3))
    assert (found.rate, found.measured_limit) == (2, True)


def test_missing_at_the_lowest_rate_in_one_round_of_two_says_so() -> None:
    """With two rounds, more than half is both: one slow round breaks the rate, and its
    median may still be within the objective."""
    found = capacity_at(rounds_curve([point(1, 0.1)], [point(1, 0.42)]), Slo(0.3))
    assert found.rate is None
    assert found.missed == (
        "TTFT p95 420 ms is 120 ms over 300 ms in one of 2 rounds, met in 1: not more than half",)


def test_a_curve_of_rounds_reads_back_with_each_rounds_points() -> None:
    made = rounds_curve([point(1, 0.1), point(2, 0.4)], [point(1, 0.2), point(2, 0.3)])
    stored = json.loads(json.dumps(made.as_dict()))
    assert stored["rounds"] == 2
    assert [r["ttft_p95_s"] for r in stored["points"][1]["rounds"]] == [0.4, 0.3]
    assert curve_from_dict(stored) == made
    assert curve_from_dict({**stored, "rounds": 0}) is None
    broken = json.loads(json.dumps(stored))
    broken["points"][0]["rounds"] = ["x"]
    assert curve_from_dict(broken) is None


def test_a_report_from_before_rounds_reads_as_one_round() -> None:
    """As SmokeReport.as_dict() wrote a curve before rounds: one sample per rate, no `rounds`
    anywhere."""
    old = {"points": [
        {"rate": 1.0, "sent": 10, "completed": 10, "errors": 0, "duration_s": 10.0,
         "ttft_p50_s": 0.05, "ttft_p95_s": 0.1, "tpot_p50_s": 0.02, "tpot_p95_s": 0.02,
         "latency_p50_s": 1.0, "output_tokens": 320, "output_tokens_per_s": 32.0,
         "first_error": None},
        {"rate": 2.0, "sent": 20, "completed": 20, "errors": 0, "duration_s": 10.0,
         "ttft_p50_s": 0.2, "ttft_p95_s": 0.4, "tpot_p50_s": 0.02, "tpot_p95_s": 0.02,
         "latency_p50_s": 1.0, "output_tokens": 640, "output_tokens_per_s": 64.0,
         "first_error": None}],
        "ttft_p95_ceiling_s": 2.0, "tpot_p95_ceiling_s": 0.2, "stopped": "ttft",
        "duration_s": 10.0, "max_tokens": 32}
    found = curve_from_dict(old)
    assert found is not None
    assert found.rounds == 1
    assert all(p.samples == (p,) for p in found.points)
    assert capacity_at(found, Slo(0.3)).rate == 1
    assert found.points[0].as_dict() == old["points"][0]  # a one-round point keeps its shape


@pytest.mark.parametrize(("rate", "capacity", "replicas"),
                         [(20, 4.2, 5), (8, 4, 2), (0.5, 4, 1), (4.0000000001, 4, 1)])
def test_replicas_are_the_rate_over_the_capacity_rounded_up(
        rate: float, capacity: float, replicas: int) -> None:
    assert plan_replicas(rate, capacity) == replicas


def test_cost_per_hour_and_per_million_output_tokens() -> None:
    per_hour, per_million = costs(rate=10, replicas=3, units=2, price=2.5,
                                  tokens_per_request=100)
    assert per_hour == 15
    assert per_million == pytest.approx(15 / (10 * 100 * 3600) * 1e6)
    assert costs(rate=1, replicas=1, units=1, price=None, tokens_per_request=5) == (None, None)


def proof(digest: str, kind: str, gpu: str, at: datetime, curve_json: Any, *,
          tp: int = 1, price: float | None = 2.0, driver: str = "570.1",
          status: str = "ready") -> CurveProof:
    return CurveProof(digest, kind, status, None, tp, 1, gpu if kind == "trtllm-engine" else None,
                      gpu, at, {"driver": driver, "cuda": None, "tensorrt": None,
                                "trtllm": "1.2.1", "vllm": "0.32.0"},
                      100.0, price, curve_json)


def test_decide_ranks_by_cost_and_keeps_unproven_and_short_apart() -> None:
    fast = curve(point(1, 0.05), point(8, 0.1), point(16, 0.6)).as_dict()
    slow = curve(point(1, 0.1), point(2, 0.6)).as_dict()
    never = curve(point(1, 0.9)).as_dict()
    proofs = [
        proof("sha256:engine", "trtllm-engine", "H100-SXM5-80GB", T0, fast, tp=2),
        proof("sha256:vllm", "vllm", "H100-SXM5-80GB", T0, slow),
        proof("sha256:tooslow", "vllm", "H100-SXM5-80GB", T0, never),
        proof("sha256:old", "vllm", "H100-SXM5-80GB", T0, fast, driver="550.1"),
        proof("sha256:nocurve", "vllm", "H100-SXM5-80GB", T0, None),
    ]
    advice = decide("m", proofs, {"H100-SXM5-80GB": {"driver": "570.1"}}, slo=Slo(0.3),
                    rate=20, prices={})

    assert [o.digest for o in advice.ranked] == ["sha256:engine", "sha256:vllm"]
    engine, vllm = advice.ranked
    assert engine.replicas == math.ceil(20 / engine.capacity.rate)  # type: ignore[operator]
    assert engine.gpus == engine.replicas * 2  # type: ignore[operator]
    assert engine.cost_per_hour == engine.gpus * 2.0  # type: ignore[operator]
    assert engine.cost_per_hour < vllm.cost_per_hour  # type: ignore[operator]
    assert [o.digest for o in advice.short] == ["sha256:tooslow"]
    reasons = {u.digest: u.reason for u in advice.unproven}
    assert "driver 550.1 → 570.1" in reasons["sha256:old"]
    assert "no capacity curve" in reasons["sha256:nocurve"]
    assert advice.as_dict()["ranked"][0]["proof"]["fingerprint"]["driver"] == "570.1"


def test_the_proof_is_the_latest_on_the_current_fingerprint_never_the_best_ever() -> None:
    good = curve(point(1, 0.05), point(16, 0.1), stopped="rates").as_dict()
    worse = curve(point(1, 0.05), point(2, 0.6)).as_dict()
    proofs = [proof("sha256:a", "vllm", "CPU", T0, good),
              proof("sha256:a", "vllm", "CPU", T0 + timedelta(days=1), worse)]
    advice = decide("m", proofs, {}, slo=Slo(0.3), rate=1, prices={"CPU": 1.0})
    (only,) = advice.ranked
    assert only.proof_at == (T0 + timedelta(days=1)).isoformat()
    assert only.capacity.rate is not None
    assert only.capacity.rate < 2
    assert only.gpus == 0  # CPU: priced per machine-hour
    assert only.cost_per_hour == 1.0


@pytest.mark.parametrize(("text", "seconds"), [("300ms", 0.3), ("0.3s", 0.3), ("300", 0.3),
                                                (" 2 s", 2.0)])
def test_durations_as_written(text: str, seconds: float) -> None:
    assert parse_duration("--ttft-p95", text) == pytest.approx(seconds)


@pytest.mark.parametrize(("text", "per_s"), [("20/s", 20), ("20", 20), ("1200/min", 20),
                                             ("72000/h", 20)])
def test_rates_as_written(text: str, per_s: float) -> None:
    assert parse_rate("--rate", text) == pytest.approx(per_s)


@pytest.mark.parametrize("text", ["abc", "-3ms", "0", "nan", "1e999", "3 parsecs", ""])
def test_bad_durations_name_the_option_and_the_value(text: str) -> None:
    with pytest.raises(UsageError, match=rf"--ttft-p95 '{text}' is not a duration"):
        parse_duration("--ttft-p95", text)


def test_prices_take_any_spelling_of_a_sku_and_refuse_junk() -> None:
    assert parse_prices("--price", ("h100=3.5",)) == {"H100-SXM5-80GB": 3.5}
    with pytest.raises(UsageError, match="--price 'h100=lots'"):
        parse_prices("--price", ("h100=lots",))
