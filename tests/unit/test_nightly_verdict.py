"""One verdict per target and the nightly's exit code from them (pipeline.nightly.verdict;
docs/commands/nightly.md, "Verdicts and exit codes"), and the report's times in ms. Pure values: the
nightly's own runs are in tests/integration/test_nightly*.py."""

from __future__ import annotations

import pytest

from pipeline.nightly.alarm import Regression, confirmed
from pipeline.nightly.diff import FieldChange
from pipeline.nightly.report import _ms
from pipeline.nightly.verdict import StageReport, TargetReport, exit_code, ordered
from pipeline.serving.loadgen import LoadLevel
from pipeline.serving.promote import ROBUST, LevelChange, Promotion

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
                                "575.57.08): c=1 100.0 → 30.0 tok/s (one smoke: not "
                                "measured again here), below 90% of its last proof")
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


def burst(concurrency: int, tokens_per_s: float) -> LoadLevel:
    return LoadLevel(concurrency, 4, 0, 64, 1.0, tokens_per_s, 0.01, 0.02, None,
                     median_request_tokens_per_s=tokens_per_s)


def suspect() -> Regression:
    """A re-proof's smoke alone: c=1 below 70% of its last proof, c=2 not."""
    return Regression("sha256:a", "H100-SXM5-80GB", 0.3, [DRIVER],
                      [LevelChange(1, 48.0, 31.0, 0.08, 0.13, True, ROBUST),
                       LevelChange(2, 48.0, 47.0, 0.08, 0.08, False, ROBUST)])


def test_a_smoke_the_node_slowed_is_no_regression_once_measured_again() -> None:
    # the CI run that failed: one smoke slow at c=1 while the machine was busy
    rounds = [[burst(1, 30.0), burst(2, 46.0)], [burst(1, 47.5), burst(2, 47.0)]]
    assert confirmed(suspect(), rounds) is None


def test_a_regression_is_kept_when_every_measurement_is_slow() -> None:
    rounds = [[burst(1, 20.0), burst(2, 47.0)], [burst(1, 32.0), burst(2, 46.0)]]
    found = confirmed(suspect(), rounds)
    assert found is not None
    assert found.measurements == 3
    [c1, c2] = found.levels
    assert (c1.regressed, c1.new_tokens_per_s, c1.rounds) == (True, 32.0, 3)  # the fastest
    assert (c2.regressed, c2.new_tokens_per_s) == (False, 47.0)
    assert "c=1 48.0 → 32.0 tok/s (the fastest of 3 measurements this run)" in str(found)
    assert "(one smoke: not measured again here)" in str(suspect())


def held_by(rule: str) -> Promotion:
    made = promotion("held")
    made.rule = rule
    return made


def test_a_hold_for_a_regression_or_a_pin_is_no_failure_and_only_the_first_unsettles() -> None:
    from datetime import UTC, datetime

    from pipeline.nightly.report import paragraph
    from pipeline.nightly.settle import hold_for_regression
    from pipeline.nightly.verdict import NightlyReport, RecipeReport

    pending = promotion("pending")
    hold_for_regression(pending, slower())
    assert (pending.action, pending.rule) == ("held", "toolchain-regressed")
    assert pending.reason.startswith("toolchain regressed: toolchain regression on "
                                     "H100-SXM5-80GB (driver 570.124.06 → 575.57.08): c=1 "
                                     "100.0 → 30.0 tok/s")
    report = NightlyReport(datetime(2026, 12, 6, tzinfo=UTC), "local", dry_run=False)
    pinned = TargetReport("p", [stage("smoke")], promotions=[held_by("rollback-pin")])
    report.recipes = [RecipeReport("toy", "toy.yaml", "sha256:r", [pinned])]
    assert (report.failures, report.settled, report.exit_code) == ([], True, 0)
    assert paragraph(report).endswith("1 held; 0 aliases promoted, 1 held. Exit 0.")
    report.recipes[0].targets.append(TargetReport("r", [stage("smoke")], promotions=[pending],
                                                  regressions=[slower()]))
    assert (report.failures, report.settled, report.exit_code) == ([], False, 5)
    gate = TargetReport("g", [stage("smoke")], promotions=[held_by("ab")])
    report.recipes[0].targets.append(gate)
    assert [f["target"] for f in report.failures] == ["g"]  # the gate's hold is listed
