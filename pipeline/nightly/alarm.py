"""The toolchain regression alarm (DESIGN §6, README "Toolchain regression alarm").

An artifact that keeps its digest and is proven again on a new fingerprint of its GPU SKU
(a re-proved entry, or the incumbent the promotion gate measured this run) is compared with
its own last proof on the previous fingerprint of that SKU. When its throughput at some
concurrency level fell below (1 - max_regression) of that proof's, the toolchain regressed:
the alarm names the fingerprint fields that moved and both numbers per level. The
comparison is `pipeline.serving.promote.compare_levels`, the gate's own; reading the registry
is the only I/O here. `target_levels` is the same comparison for a target the report shows
(its artifact under the old keys, then now), with no alarm attached.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from pipeline.nightly.diff import FieldChange, toolchain_changes
from pipeline.serving.promote import (
    MEAN,
    ROBUST,
    LevelChange,
    Promotion,
    compare_levels,
    latest_passing,
)
from registry.sql import records, smoke_records
from registry.sql.smoke_records import SmokeRecord

if TYPE_CHECKING:
    from pipeline.executors.outcome import Outcome
    from pipeline.planning.plan import Plan
    from registry.context import Context


@dataclass
class Regression:
    """A toolchain regression of *digest* on *gpu*: *levels* old (previous fingerprint) and
    new (this one), the regressed ones flagged; *changes* the fingerprint fields that moved."""

    digest: str
    gpu: str
    max_regression: float
    changes: list[FieldChange] = field(default_factory=list)
    levels: list[LevelChange] = field(default_factory=list)
    role: str = "re-proof"  # or "incumbent": the artifact an alias points at, gate-measured

    @property
    def cause(self) -> str:
        """`driver 570.124.06 → 575.57.08` (every field that moved), or a plain phrase."""
        return ", ".join(str(c) for c in self.changes) or "the toolchain changed"

    @property
    def worst(self) -> LevelChange:
        return min((lv for lv in self.levels if lv.regressed),
                   key=lambda lv: (lv.new_tokens_per_s or 0) / (lv.old_tokens_per_s or 1))

    def __str__(self) -> str:
        numbers = ", ".join(
            f"c={lv.concurrency} {lv.old_tokens_per_s:.1f} → {lv.new_tokens_per_s:.1f} tok/s"
            for lv in self.levels if lv.regressed
            and lv.old_tokens_per_s is not None and lv.new_tokens_per_s is not None)
        whose = f" of the incumbent {self.digest[:19]}…" if self.role == "incumbent" else ""
        return (f"toolchain regression{whose} on {self.gpu} ({self.cause}): {numbers}, below "
                f"{1 - self.max_regression:.0%} of its last proof")

    def as_dict(self) -> dict[str, Any]:
        return {"digest": self.digest, "gpu": self.gpu, "role": self.role,
                "max_regression": self.max_regression, "cause": self.cause,
                "changes": [c.as_dict() for c in self.changes],
                "levels": [lv.as_dict() for lv in self.levels], "text": str(self)}


def previous_proof(reports: list[SmokeRecord], gpu: str, toolchain: dict[str, Any],
                   before: datetime | None = None) -> SmokeRecord | None:
    """The last passing proof on *gpu* (made before *before*, when given) whose fingerprint
    is not *toolchain*."""
    found = None
    for report in reports:
        if before is not None and report.created_at >= before:
            break
        if report.passed and report.gpu == gpu and report.toolchain is not None \
                and report.toolchain != toolchain:
            found = report
    return found


def _judged(digest: str, gpu: str, max_regression: float, old: SmokeRecord | None, *,
            new: Mapping[str, Any], toolchain: dict[str, Any], role: str) -> Regression | None:
    if old is None or old.toolchain is None:
        return None
    levels = compare_levels(old.report, new, max_regression)
    if not any(lv.regressed for lv in levels):
        return None
    return Regression(digest, gpu, max_regression, toolchain_changes(old.toolchain, toolchain),
                      levels, role)


def regression(session: Session, digest: str, gpu: str, max_regression: float, *,
               since: datetime, key: str | None = None) -> Regression | None:
    """The toolchain regression of re-proved *digest* on *gpu* (None: none, or nothing to
    compare): its latest passing proof there made at or after *since* (this run; by smoke
    run *key*, when given) against its last proof on the previous fingerprint."""
    reports = smoke_records.smoke_reports(session, digest)
    new = next((r for r in reversed(reports) if r.passed and r.gpu == gpu
                and r.toolchain is not None and r.created_at >= since
                and (key is None or r.key == key)), None)
    if new is None or new.toolchain is None:
        return None
    old = previous_proof(reports, gpu, new.toolchain, before=new.created_at)
    return _judged(digest, gpu, max_regression, old, new=new.report, toolchain=new.toolchain,
                   role="re-proof")


def incumbent_regression(session: Session, promotion: Promotion, gpu: str,
                         max_regression: float,
                         toolchain: dict[str, Any]) -> Regression | None:
    """The toolchain regression of the incumbent the promotion gate served this run on
    *toolchain* (`Promotion.rule` "ab": its levels' old side is the incumbent's medians),
    against the incumbent's last proof on the previous fingerprint of *gpu*."""
    if promotion.rule != "ab" or promotion.old is None or not promotion.levels:
        return None
    measured = {"load": [{"concurrency": lv.concurrency, ROBUST: lv.old_tokens_per_s,
                          MEAN: lv.old_tokens_per_s, "median_ttft_s": lv.old_ttft_p50_s,
                          "ttft_p50_s": lv.old_ttft_p50_s}
                         for lv in promotion.levels if lv.old_tokens_per_s is not None]}
    old = previous_proof(smoke_records.smoke_reports(session, promotion.old), gpu, toolchain)
    return _judged(promotion.old, gpu, max_regression, old, new=measured, toolchain=toolchain,
                   role="incumbent")


def target_levels(ctx: Context, plan: Plan, old: Plan | None, target_id: str,
                   outcomes: dict[str, Outcome]) -> tuple[list[LevelChange], dict[str, Any] | None]:
    """The target's smoke throughput before (its artifact under the old keys, measured on
    this SKU) and now, per level, and how its smoke now started (`ready_s`, and the
    `warm_cache` it started from: None, cold): what the report shows beside its verdict."""
    new_chain = next(p.chain for p in plan.targets if p.target.id == target_id)
    smoke = outcomes.get(new_chain[-1])
    if smoke is None or smoke.digest is None or smoke.status not in ("built", "reused"):
        return [], None
    old_chain = None if old is None else next(
        (p.chain for p in old.targets if p.target.id == target_id), None)
    gpu = plan.target(target_id).gpu.sku
    with ctx.registry.session(readonly=True) as session:
        new_report = latest_passing(smoke_records.smoke_reports(session, smoke.digest),
                                    key=new_chain[-1])
        old_report = None
        if old_chain is not None:
            entry = records.find_by_keys(session, {old_chain[-2]}).get(old_chain[-2])
            if entry is not None:
                old_report = latest_passing(smoke_records.smoke_reports(session, entry.digest),
                                            key=old_chain[-1], gpu=gpu)
    start = None if new_report is None else {
        "ready_s": new_report.report.get("ready_s"),
        "warm_cache": new_report.report.get("warm_cache")}
    return compare_levels(old_report.report if old_report else None,
                          new_report.report if new_report else None, None), start
