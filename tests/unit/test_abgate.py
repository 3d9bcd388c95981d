"""The promotion gate's rule (pipeline.serving.abgate.decide) and the robust figure compare_levels
prefers: pure, over load levels written by hand."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.serving.abgate import decide
from pipeline.serving.loadgen import LoadLevel, median
from pipeline.serving.promote import compare_levels


def level(concurrency: int, tokens_per_s: float, *, errors: int = 0,
          burst: float | None = None) -> LoadLevel:
    """One round at one level whose median request ran at *tokens_per_s* (its burst's mean
    *burst*, when given, else the same)."""
    mean = tokens_per_s if burst is None else burst
    return LoadLevel(concurrency, 8, errors, 64, 64 / mean, mean, 0.01, 0.02, None,
                     median_request_tokens_per_s=tokens_per_s, median_ttft_s=0.01,
                     round_medians=[tokens_per_s])


def rounds(*figures: float, concurrency: int = 1) -> list[list[LoadLevel]]:
    return [[level(concurrency, f)] for f in figures]


def test_median() -> None:
    assert median([]) is None
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 2.0, 3.0]) == 2.5


@pytest.mark.parametrize(("incumbent", "candidate", "passed", "tie"), [
    ((100, 101, 99), (99, 100, 98), True, False),    # the same speed
    ((100, 100, 100), (96, 96, 96), True, False),    # 4% slower: within max_regression
    ((100, 100, 100), (33, 34, 33), False, False),   # 3x slower: held
    ((50, 50, 51), (49, 50, 50), True, False),       # both slowed (the node): no worse now
    ((100, 70, 130), (90, 90, 90), True, True),      # 10% short, inside a 60% spread: a tie
    ((100, 99, 101), (90, 90, 90), False, False),    # 10% short, beyond a 2% spread: held
])
def test_the_rule(incumbent: tuple[float, ...], candidate: tuple[float, ...], passed: bool,
                  tie: bool) -> None:
    result = decide(rounds(*incumbent), rounds(*candidate), 0.05)
    assert result.rule == "ab"
    assert result.passed is passed, result.reason
    [one] = result.levels
    assert (one.rounds, one.tie, one.regressed) == (3, tie, not passed)
    assert one.incumbent_tokens_per_s == median(incumbent)
    assert one.candidate_tokens_per_s == median(candidate)
    if not passed:
        assert "same-run A/B" in result.reason
        assert "concurrency 1" in result.reason


def test_one_level_holds_it_and_failed_requests_count() -> None:
    incumbent = [[level(1, 100), level(4, 300)] for _ in range(2)]
    slower_at_4 = [[level(1, 100), level(4, 100)] for _ in range(2)]
    result = decide(incumbent, slower_at_4, 0.05)
    assert not result.passed
    assert [lv.regressed for lv in result.levels] == [False, True]
    failing = [[level(1, 100, errors=2)] for _ in range(2)]
    lost = decide(rounds(100, 100), failing, 0.05)
    assert not lost.passed
    assert "requests failed" in lost.reason


def smoke(*levels: dict[str, Any]) -> dict[str, Any]:
    return {"load": list(levels)}


def test_compare_levels_prefers_the_median_of_requests() -> None:
    # one burst's mean halved by a few slow requests; the requests' median unmoved
    old = smoke({"concurrency": 1, "output_tokens_per_s": 100.0, "ttft_p50_s": 0.1,
                 "median_request_tokens_per_s": 100.0, "median_ttft_s": 0.1, "rounds": 1})
    noisy = smoke({"concurrency": 1, "output_tokens_per_s": 50.0, "ttft_p50_s": 0.1,
                   "median_request_tokens_per_s": 99.0, "median_ttft_s": 0.1, "rounds": 1})
    [robust] = compare_levels(old, noisy, 0.05)
    assert (robust.figure, robust.regressed) == ("median_request_tokens_per_s", False)
    assert (robust.old_tokens_per_s, robust.new_tokens_per_s) == (100.0, 99.0)
    slower = smoke({"concurrency": 1, "output_tokens_per_s": 33.0,
                    "median_request_tokens_per_s": 33.0})
    assert compare_levels(old, slower, 0.05)[0].regressed
    # an old report without the median: both sides' burst means, as before
    legacy = smoke({"concurrency": 1, "output_tokens_per_s": 100.0, "ttft_p50_s": 0.1})
    [mean] = compare_levels(legacy, noisy, 0.05)
    assert (mean.figure, mean.new_tokens_per_s, mean.regressed) == \
        ("output_tokens_per_s", 50.0, True)
