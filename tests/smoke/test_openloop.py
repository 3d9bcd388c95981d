"""The open-loop capacity curve a smoke measures when the recipe asks (smoke.capacity),
against tests/fakes/openai_server.py with one batch slot: traffic past what it serves queues,
as a real server's does once its batch is full."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from pipeline.recipe.schema import CapacitySettings, SmokeSettings
from pipeline.serving.capacity import curve_from_dict
from pipeline.serving.openloop import arrivals
from tests.smoke.test_harness import run

ONE_SLOT = {"FAKE_OPENAI_MAX_RUNNING": "1", "FAKE_OPENAI_TOKEN_DELAY_S": "0.01"}


def test_each_round_goes_up_the_rates_until_ttft_passes_its_ceiling(
    fake_argv: list[str], model_dir: Path, settings: SmokeSettings, tmp_path: Path
) -> None:
    # one slot, 4 tokens × 10 ms: ~25 requests/s; 2/s is served at once, 60/s queues
    asked = CapacitySettings(rates=[2, 60, 120], duration_s=0.5, ttft_p95_ms=400,
                             tpot_p95_ms=1000, rounds=2)
    report = run(fake_argv, model_dir, settings.model_copy(update={"capacity": asked}),
                 tmp_path, env=ONE_SLOT)

    assert report.passed, report.failure
    curve = report.capacity
    assert curve is not None
    assert [p.rate for p in curve.points] == [2, 60]  # 120/s never sent: the ceiling passed
    assert curve.stopped == "ttft"
    low, high = curve.points
    assert low.errors == high.errors == 0
    assert low.completed == low.sent >= 1
    assert low.output_tokens == 4 * low.completed
    assert low.ttft_p95_s is not None
    assert low.ttft_p95_s <= 0.4
    assert high.ttft_p95_s is not None
    assert high.ttft_p95_s > 0.4
    assert high.sent > low.sent
    assert curve.rounds == 2
    for combined in (low, high):  # each rate's two rounds, kept, their own arrivals each
        first, second = combined.samples
        assert first.rate == second.rate == combined.rate
        assert first.sent + second.sent == combined.sent
        assert combined.ttft_p95_s == pytest.approx(  # the median round's: of two, the mean
            ((first.ttft_p95_s or 0) + (second.ttft_p95_s or 0)) / 2)
    stored = json.loads(json.dumps(report.as_dict()))["capacity"]  # plain JSON, read back
    assert curve_from_dict(stored) == curve


def test_without_smoke_capacity_the_report_has_no_curve(
    fake_argv: list[str], model_dir: Path, settings: SmokeSettings, tmp_path: Path
) -> None:
    report = run(fake_argv, model_dir, settings, tmp_path)

    assert report.passed, report.failure
    assert report.capacity is None
    assert "capacity" not in report.as_dict()


def test_arrivals_are_a_seeded_poisson_schedule_within_the_window() -> None:
    first = arrivals(50, 2.0, random.Random("0:50"))
    assert first == arrivals(50, 2.0, random.Random("0:50"))
    assert first == sorted(first)
    assert all(0 <= at < 2.0 for at in first)
    assert 60 <= len(first) <= 140  # 100 expected; far outside this is not Poisson(50/s)
    assert arrivals(0.001, 1.0, random.Random(1)) == [0.0]  # at least one request
