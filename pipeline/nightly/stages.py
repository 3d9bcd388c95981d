"""What each stage run of a nightly's target did, why its key moved, and whose fault it is
when it did not succeed (`stage_report`)."""

from __future__ import annotations

from pipeline.nightly.diff import KeyChange
from pipeline.nightly.verdict import StageReport
from pipeline.planning.outcome import Outcome
from pipeline.planning.plan import Plan
from registry.sql import leases


def stage_report(plan: Plan, key: str, change: KeyChange | None,
                  previous: leases.StageRunRecord | None, outcome: Outcome | None, *,
                  dry_run: bool) -> StageReport:
    run = plan.stages[key]
    because = list(change.because) if change else [_unexplained(previous)]
    if dry_run:
        return StageReport(run.stage, key, because, "would run")
    if outcome is None:
        return StageReport(run.stage, key, because, "skipped")
    log = run.workdir / f"{run.stage}.log"
    shown = str(log) if outcome.status not in ("built", "reused") and log.is_file() else None
    return StageReport(run.stage, key, because, outcome.status, outcome.digest, outcome.error,
                       shown, _fault(plan, key, outcome.status))


def _fault(plan: Plan, key: str, status: str) -> str | None:
    """Whose fault a stage run that did not succeed is: the machine's when it could not run
    here (a runtime missing, a run stopped, fewer GPUs than it needs: `capacity`), else the
    artifact's (its build or smoke failed); None when it succeeded or never ran."""
    if status in ("pending-smoke", "cancelled"):
        return "machine"
    if status == "smoke-failed":
        return "artifact"
    if status != "failed":
        return None
    from pipeline.planning.capacity import run_need, shortfall, this_node

    need = run_need(plan, plan.stages[key])
    return "machine" if need is not None and shortfall(need, this_node()) else "artifact"


def _unexplained(run: leases.StageRunRecord | None) -> str:
    """Why a key is missing that no toolchain change moved: a new target or recipe change,
    or a run that did not succeed (it failed, was stopped, or its smoke did not pass)."""
    if run is None:
        return "not built before"
    return f"its last run {run.status}" + (f" ({run.error[:120]})" if run.error else "")
