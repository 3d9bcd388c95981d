"""One verdict per target of a nightly, and the exit code that follows from them (README
"Nightly verdicts and exit codes"). Pure.

    unchanged   nothing the target needs moved: its keys are all in the registry
    rebuilt     a stage before the smoke ran again (a new artifact), no alias to move
    re-proved   the same artifact smoked on the new fingerprint, no slower than allowed
    promoted    an alias moved to the target's artifact through the gate
    held        the gate kept an alias where it was (its numbers are the promotion's)
    regressed   a toolchain regression (`pipeline.nightly.alarm`), named by its cause
    skipped     this machine lacks the target's GPU: not a failure
    failed      a stage failed, said whose fault: `machine` (too few GPUs, a runtime that
                is missing, a run stopped) or `artifact` (its build failed, its smoke failed)

A dry run says `would rebuild` or `would re-prove` instead.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from pipeline.nightly.alarm import Regression
from pipeline.nightly.diff import FieldChange
from pipeline.serving.promote import LevelChange, Promotion

VERDICTS: Final = ("regressed", "failed", "held", "promoted", "rebuilt", "re-proved",
                   "skipped", "unchanged", "would rebuild", "would re-prove")
"""Every verdict, in the order a report lists targets: what to act on first."""

HELD_FOR_REGRESSION: Final = "toolchain-regressed"
"""`Promotion.rule` of a promotion the gate let through and a toolchain regression of its
pool held (`pipeline.nightly.settle`)."""

FAILED_OUTCOMES: Final = ("failed", "smoke-failed", "cancelled", "skipped", "pending-smoke")


@dataclass
class StageReport:
    """One stage run of a target whose key the registry lacked."""

    stage: str
    key: str
    because: list[str]
    outcome: str  # the build's outcome status, or "would run" on a dry run
    digest: str | None = None
    error: str | None = None
    log: str | None = None
    fault: str | None = None  # "machine" or "artifact" when the run did not succeed

    def as_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "key": self.key, "because": self.because,
                "outcome": self.outcome, "digest": self.digest, "error": self.error,
                "log": self.log, "fault": self.fault}


@dataclass
class TargetReport:
    id: str
    stages: list[StageReport] = field(default_factory=list)
    levels: list[LevelChange] = field(default_factory=list)
    """Old and new smoke throughput and TTFT per concurrency level."""
    promotions: list[Promotion] = field(default_factory=list)
    regressions: list[Regression] = field(default_factory=list)
    skipped: str | None = None
    """Why this machine cannot run the target (it lacks its GPU), when it cannot."""
    evidence: str | None = None
    """The log or smoke report log the verdict came from (a local path), when there is one."""
    start: dict[str, Any] | None = None
    """This run's smoke start: `ready_s`, and `warm_cache` when it started from one."""

    @property
    def failed_stage(self) -> StageReport | None:
        return next((s for s in self.stages if s.outcome in FAILED_OUTCOMES), None)

    @property
    def fault(self) -> str | None:
        """Whose fault a failed target is: `machine` or `artifact` (None: not failed)."""
        faults = [s.fault for s in self.stages if s.fault]
        if not faults:
            return None
        return "machine" if "machine" in faults else "artifact"

    @property
    def verdict(self) -> str:  # noqa: PLR0911 - one return per verdict, in order
        if self.skipped is not None:
            return "skipped"
        if not self.stages:
            return "unchanged"
        if any(s.outcome == "would run" for s in self.stages):
            return "would rebuild" if any(s.stage != "smoke" for s in self.stages) \
                else "would re-prove"
        if self.failed_stage is not None:
            return "failed"
        if self.regressions:
            return "regressed"
        actions = {p.action for p in self.promotions}
        if "held" in actions:
            return "held"
        if "promoted" in actions:
            return "promoted"
        return "rebuilt" if any(s.stage != "smoke" for s in self.stages) else "re-proved"

    @property
    def detail(self) -> str:
        """What the verdict rests on, in one line (empty when it is plain)."""
        verdict = self.verdict
        if verdict == "regressed":
            return "; ".join(str(r) for r in self.regressions)
        if verdict == "failed":
            stage = self.failed_stage
            assert stage is not None  # noqa: S101 - failed means a stage failed
            return f"{self.fault} fault: {stage.stage} {stage.outcome}: {stage.error or ''}" \
                .rstrip(": ")
        if verdict == "held":
            return "; ".join(f"{p.alias}: {p.reason}" for p in self.promotions
                             if p.action == "held")
        if verdict == "skipped":
            return self.skipped or ""
        return ""

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "verdict": self.verdict, "detail": self.detail,
                "fault": self.fault, "evidence": self.evidence, "skipped": self.skipped,
                "stages": [s.as_dict() for s in self.stages],
                "levels": [level.as_dict() for level in self.levels],
                "promotions": [p.as_dict() for p in self.promotions],
                "regressions": [r.as_dict() for r in self.regressions],
                "start": self.start}


def ordered(targets: Iterable[TargetReport]) -> list[TargetReport]:
    """*targets* in the order to read them: regressions, failures and holds first."""
    return sorted(targets, key=lambda t: VERDICTS.index(t.verdict))


def exit_code(targets: Iterable[TargetReport], recipe_codes: Iterable[int] = ()) -> int:
    """The nightly's exit code from its verdicts; the first row that matches (README):

        5   a target `regressed` (the toolchain regression alarm)
        3   a target `failed` by the machine's fault, or at a stage before its smoke (as
            `enginectl build` exits 3 when a stage fails), or a recipe could not be planned
            or built at all (its own code when that is 5)
        5   a target `failed` its smoke (the artifact's fault), or is `held` by its gate
        0   everything else: unchanged, rebuilt, re-proved, promoted, skipped, and a hold
            that only keeps a rollback (a person pinned the alias; nothing regressed)
    """
    found = list(targets)
    codes = set(recipe_codes)
    verdicts = {t.verdict for t in found}
    if "regressed" in verdicts:
        return 5
    failed = [t for t in found if t.verdict == "failed"]
    if codes - {5} or any(
            t.fault == "machine" or (t.failed_stage is not None
                                     and t.failed_stage.stage != "smoke") for t in failed):
        return 3
    gate_held = any(p.action == "held" and p.rule != "rollback-pin"
                    for t in found if t.verdict == "held" for p in t.promotions)
    if failed or gate_held or 5 in codes:
        return 5
    return 0


@dataclass
class PoolReport:
    pool: str
    gpu: str | None
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    before_at: datetime | None
    changes: list[FieldChange] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"pool": self.pool, "gpu": self.gpu, "before": self.before, "after": self.after,
                "before_probed_at": self.before_at.isoformat() if self.before_at else None,
                "changes": [c.as_dict() for c in self.changes]}


@dataclass
class RecipeReport:
    name: str
    path: str
    digest: str
    targets: list[TargetReport] = field(default_factory=list)
    error: str | None = None  # the recipe could not be planned or built at all
    exit_code: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "path": self.path, "digest": self.digest,
                "error": self.error, "targets": [t.as_dict() for t in self.targets]}


@dataclass
class NightlyReport:
    started_at: datetime
    executor: str
    dry_run: bool
    accept_regression: bool = False
    """Given `--accept-regression`: aliases of a pool whose toolchain regressed move."""
    finished_at: datetime | None = None
    pools: list[PoolReport] = field(default_factory=list)
    recipes: list[RecipeReport] = field(default_factory=list)
    since: datetime | None = None
    """When the last nightly ran (what "nothing changed since" refers to)."""
    waited_for: str | None = None
    """The nightly this one waited for (its owner), if another held the lease."""
    notify: dict[str, Any] | None = None

    @property
    def targets(self) -> list[TargetReport]:
        return [t for r in self.recipes for t in r.targets]

    @property
    def settled(self) -> bool:
        """Whether this run did every target's work: no promotion is held for a toolchain
        regression (else the next nightly takes up the same work: `nightly_runs.baseline`)."""
        return not any(p.rule == HELD_FOR_REGRESSION for t in self.targets
                       for p in t.promotions)

    @property
    def nothing_changed(self) -> bool:
        return not any(p.changes for p in self.pools) and not any(
            r.error for r in self.recipes) and all(
            t.verdict == "unchanged" for t in self.targets)

    @property
    def regressions(self) -> list[dict[str, Any]]:
        """Every toolchain regression, with its recipe and target (what the report leads
        with)."""
        return [{"recipe": recipe.name, "target": target.id, **found.as_dict()}
                for recipe in self.recipes for target in recipe.targets
                for found in target.regressions]

    @property
    def failures(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        for recipe in self.recipes:
            if recipe.error:
                found.append({"recipe": recipe.name, "target": None, "stage": None,
                              "key": None, "error": recipe.error, "log": None})
            for target in recipe.targets:
                if target.skipped is not None:
                    continue
                found += [{"recipe": recipe.name, "target": target.id, **s.as_dict()}
                          for s in target.stages if s.outcome in
                          ("failed", "smoke-failed", "cancelled", "pending-smoke")]
                found += [{"recipe": recipe.name, "target": target.id, "stage": "promote",
                           "key": None, "outcome": "held", "alias": p.alias,
                           "error": p.reason, "log": None}
                          for p in target.promotions if p.action == "held"
                          and p.rule not in ("rollback-pin", HELD_FOR_REGRESSION)]
        return found

    @property
    def exit_code(self) -> int:
        """From the verdicts, by the table of `pipeline.nightly.verdict.exit_code`."""
        return exit_code(self.targets, [r.exit_code for r in self.recipes if r.error])
