"""One verdict per target and the nightly's exit code from them (pipeline.nightly.verdict;
docs/commands/nightly.md, "Verdicts and exit codes"), and the report's times in ms. Pure values: the
nightly's own runs are in tests/integration/test_nightly*.py."""

from __future__ import annotations

import pytest

from pipeline.nightly.alarm import Regression
from pipeline.nightly.diff import FieldChange
from pipeline.nightly.report import _ms
from pipeline.nightly.verdict import StageReport, TargetReport, exit_code, ordered
from pipeline.serving.promote import LevelChange, Promotion

KEY = "k1:" + "0" * 64
DRIVER = FieldChange("driver", "570.124.06", "575.57.08")


def stage(name: str, outcome: str = "built", fault: str | None = None) -> StageReport:
    return StageReport(name, KEY, ["driver 570.124.06 → 575.57.08"], outcome, fault=fault)


def promotion(action: str) -> Promotion:
    return Promotion("m/h100/trtllm", "t", action, "sha256:a", "sha256:b",  # type: ignore[arg-type]
                     0.1, reason="why", rule="ab")


def slower() -> Regression:
    return Regression("sha256:a", "H100-SXM5-80GB", 0.1, [DRIVER],
                      [LevelChange(1, 100.0, 30.0, 0.01, 0.03, regressed=True)])


def test_each_verdict_follows_from_what_happened() -> None:
    assert TargetReport("t").verdict == "unchanged"
    assert TargetReport("t", [stage("smoke")]).verdict == "re-proved"
    assert TargetReport("t", [stage("build"), stage("smoke")]).verdict == "rebuilt"
    assert TargetReport("t", [stage("build"), stage("smoke")],
                        promotions=[promotion("promoted")]).verdict == "promoted"
    assert TargetReport("t", [stage("build"), stage("smoke")],
                        promotions=[promotion("held")]).verdict == "held"
    regressed = TargetReport("t", [stage("smoke")], regressions=[slower()])
    assert regressed.verdict == "regressed"
    assert regressed.detail == ("toolchain regression on H100-SXM5-80GB (driver 570.124.06 → "
                                "575.57.08): c=1 100.0 → 30.0 tok/s, below 90% of its last "
                                "proof")
    skipped = TargetReport("t", [stage("build", "skipped")], skipped="needs a H100")
    assert (skipped.verdict, skipped.fault) == ("skipped", None)
    failed = TargetReport("t", [stage("build", "failed", "artifact"), stage("smoke", "skipped")])
    assert (failed.verdict, failed.fault) == ("failed", "artifact")
    machine = TargetReport("t", [stage("smoke", "pending-smoke", "machine")])
    assert (machine.verdict, machine.fault) == ("failed", "machine")
    assert machine.detail.startswith("machine fault: smoke pending-smoke")


@pytest.mark.parametrize(("targets", "code"), [
    ([], 0),
    ([TargetReport("t")], 0),
    ([TargetReport("t", [stage("build", "skipped")], skipped="needs a H100")], 0),
    ([TargetReport("t", [stage("smoke")])], 0),
    ([TargetReport("t", [stage("smoke")], promotions=[promotion("promoted")])], 0),
    ([TargetReport("t", [stage("smoke")], promotions=[promotion("held")])], 5),
    ([TargetReport("t", [stage("smoke", "smoke-failed", "artifact")])], 5),
    ([TargetReport("t", [stage("build", "failed", "artifact")])], 3),
    ([TargetReport("t", [stage("smoke", "failed", "machine")])], 3),
    # the alarm wins over a machine fault elsewhere: a regression is never hidden
    ([TargetReport("t", [stage("smoke", "failed", "machine")]),
      TargetReport("u", [stage("smoke")], regressions=[slower()])], 5),
    ([TargetReport("t", [stage("smoke", "smoke-failed", "artifact")]),
      TargetReport("u", [stage("build", "failed", "artifact")])], 3),
])
def test_the_exit_code_table(targets: list[TargetReport], code: int) -> None:
    assert exit_code(targets) == code


def test_a_recipe_that_could_not_run_exits_with_the_table() -> None:
    assert exit_code([], [3]) == 3
    assert exit_code([], [2]) == 3
    assert exit_code([], [5]) == 5
    assert exit_code([TargetReport("u", [stage("smoke")], regressions=[slower()])], [3]) == 5


def test_regressions_failures_and_holds_are_listed_first() -> None:
    targets = [TargetReport("a"), TargetReport("b", [stage("smoke")]),
               TargetReport("c", [stage("smoke")], promotions=[promotion("held")]),
               TargetReport("d", [stage("smoke")], regressions=[slower()]),
               TargetReport("e", [stage("build", "failed", "artifact")])]
    assert [t.id for t in ordered(targets)] == ["d", "e", "c", "b", "a"]


@pytest.mark.parametrize(("seconds", "shown"), [
    (None, "-"), (0.0004213, "0.42"), (0.0123, "12.3"), (0.25, "250"), (1.5, "1500")])
def test_times_are_in_ms_with_three_significant_digits(seconds: float | None,
                                                       shown: str) -> None:
    assert _ms(seconds) == shown
