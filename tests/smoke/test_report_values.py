"""The report's values: nearest-rank percentiles, cost per 1M tokens, token agreement, and
as_dict's JSON."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.serving.checks import Check
from pipeline.serving.loadgen import (
    LoadLevel,
    cost_per_million_tokens,
    percentile,
    token_agreement,
)
from pipeline.serving.smoke import SmokeReport

SAMPLE = [15.0, 20.0, 35.0, 40.0, 50.0]


@pytest.mark.parametrize(
    ("values", "pct", "expected"),
    [
        (SAMPLE, 5, 15.0),
        (SAMPLE, 30, 20.0),
        (SAMPLE, 40, 20.0),
        (SAMPLE, 50, 35.0),
        (SAMPLE, 95, 50.0),
        (SAMPLE, 100, 50.0),
        (SAMPLE, 0, 15.0),
        (list(reversed(SAMPLE)), 50, 35.0),  # order of the input does not matter
        ([3.0], 50, 3.0),
        ([3.0], 95, 3.0),
        ([1.0, 2.0], 50, 1.0),
        ([1.0, 2.0], 51, 2.0),
        ([float(i) for i in range(1, 101)], 95, 95.0),
        ([float(i) for i in range(1, 21)], 95, 19.0),
        ([], 50, None),
    ],
)
def test_percentile_is_nearest_rank(values: list[float], pct: float, expected: float | None
                                    ) -> None:
    assert percentile(values, pct) == expected


@pytest.mark.parametrize("pct", [-1, 100.5, math.nan])
def test_percentile_refuses_a_percentage_out_of_range(pct: float) -> None:
    with pytest.raises(ValueError, match=r"within 0\.\.100"):
        percentile(SAMPLE, pct)


@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1),
       st.floats(min_value=0.01, max_value=100))
def test_percentile_is_the_smallest_value_covering_pct(values: list[float], pct: float
                                                       ) -> None:
    found = percentile(values, pct)
    assert found in values
    share = sum(v <= found for v in values) / len(values)
    assert share * 100 >= pct - 1e-9
    below = [v for v in values if v < found]
    assert len(below) / len(values) * 100 < pct + 1e-9


@pytest.mark.parametrize(
    ("price", "tokens_per_s", "expected"),
    [
        (3.6, 1000.0, 1.0),  # $3.60/h at 1000 tok/s: 3.6M tokens an hour, $1 per million
        (2.0, 500.0, 2.0 / (500.0 * 3600) * 1e6),
        (0.0, 100.0, 0.0),
        (10.0, 1e6, 10.0 / 3600),
        (None, 1000.0, None),
        (3.6, None, None),
        (3.6, 0.0, None),
    ],
)
def test_cost_per_million_tokens(price: float | None, tokens_per_s: float | None,
                                 expected: float | None) -> None:
    got = cost_per_million_tokens(price, tokens_per_s)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected)


def test_the_price_is_one_gpus_and_an_artifact_pays_for_every_gpu_it_serves_on() -> None:
    """A tp 4 engine at the tokens/s of a tp 1 one costs four times as much per token: the
    recipe's price is per GPU-hour (as advise reads it), and the smoke's cost counted it once."""
    one = cost_per_million_tokens(3.6, 1000.0)
    assert cost_per_million_tokens(3.6, 1000.0, gpus=4) == pytest.approx(4 * one)
    assert cost_per_million_tokens(None, 1000.0, gpus=4) is None


@pytest.mark.parametrize(
    ("got", "expected", "agreement"),
    [
        ([1, 2, 3, 4], [1, 2, 3, 4], 1.0),
        ([1, 2, 3, 4], [1, 2, 9, 4], 0.75),
        ([1, 2], [1, 2, 3, 4], 0.5),  # missing tokens disagree
        ([1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4], 0.5),  # so do extra ones
        ([2, 3, 4], [1, 2, 3], 0.0),  # positions, not a diff: a shift disagrees everywhere
        ([], [], 1.0),
        ([], [1], 0.0),
        (["a", "b"], ["a", "c"], 0.5),
    ],
)
def test_token_agreement(got: list[object], expected: list[object], agreement: float) -> None:
    assert token_agreement(got, expected) == agreement


def test_as_dict_is_json_that_any_json_column_takes(tmp_path: Path) -> None:
    level = LoadLevel(concurrency=1, requests=1, errors=0, output_tokens=3, wall_s=0.5,
                      output_tokens_per_s=6.0, ttft_p50_s=None, ttft_p95_s=math.inf,
                      first_error=None)
    report = SmokeReport(
        passed=True, checks=[Check("greedy", True, "ok", {"outputs": [{"text": "a\x00b"}]})],
        load=[level], ready_s=1.5, best_output_tokens_per_s=6.0,
        cost_per_million_tokens=cost_per_million_tokens(1.0, 6.0), price_per_hour=1.0,
        log_path=tmp_path / "smoke.log", argv=["serve", "--port", "1234"], failure=None,
    )
    text = json.dumps(report.as_dict(), allow_nan=False)  # NaN/Infinity are not JSON

    assert "\\u0000" not in text  # PostgreSQL's jsonb refuses NUL
    data = json.loads(text)
    assert data["checks"][0]["evidence"]["outputs"][0]["text"] == "a\u2400b"
    assert data["load"][0]["ttft_p95_s"] is None
    assert data["log_path"] == str(tmp_path / "smoke.log")
    assert report.checks[0].evidence["outputs"][0]["text"] == "a\x00b"  # the report keeps it
