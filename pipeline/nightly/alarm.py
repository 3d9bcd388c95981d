"""The toolchain regression alarm (DESIGN §6, README "Toolchain regression alarm").

An artifact that keeps its digest and is proven again on a new fingerprint of its GPU SKU
(a re-proved entry, or the incumbent the promotion gate measured this run) is compared with
its own last proof on the previous fingerprint of that SKU. The old toolchain is gone, so the
two sides cannot be measured in one run as the gate's are; the rule is made to survive a
busy node instead. Noise only ever slows a server down, and a toolchain that really made the
artifact slower slows every measurement of it, so the figure compared is the *fastest* of
this run's measurements at each level: a re-proof's smoke, or the gate's rounds of an
incumbent, and, when those are below the line, `nightly.gate_rounds` rounds measured again
here (`confirmed`, with `pipeline.serving.abgate.remeasure`). When even the fastest is below
(1 - max_regression) of the last proof's throughput at some concurrency level, the toolchain
regressed: the alarm names the fingerprint fields that moved and both numbers per level. A
re-proof this machine cannot serve again (a Ray nightly's driver without its GPU) is judged
on its smoke alone, and says so. The per-level comparison is
`pipeline.serving.promote.compare_levels`, the gate's own; reading the registry is the only
I/O here. `target_levels` is the same comparison for a target the report shows (its artifact
under the old keys, then now), with no alarm attached.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from pipeline.nightly.diff import FieldChange, toolchain_changes
from pipeline.serving.abgate import figure
from pipeline.serving.loadgen import LoadLevel
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
    from pipeline.planning.outcome import Outcome
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
    # how many of this run's measurements the new figures are the fastest of (1: a re-proof's
    # smoke alone, which this machine could not measure again)
    measurements: int = 1

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
        fastest = (f"the fastest of {self.measurements} measurements this run"
                   if self.measurements > 1 else "one smoke: not measured again here")
        return (f"toolchain regression{whose} on {self.gpu} ({self.cause}): {numbers} "
                f"({fastest}), below {1 - self.max_regression:.0%} of its last proof")

    def as_dict(self) -> dict[str, Any]:
        return {"digest": self.digest, "gpu": self.gpu, "role": self.role,
                "max_regression": self.max_regression, "cause": self.cause,
                "measurements": self.measurements,
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
            new: Mapping[str, Any], toolchain: dict[str, Any], role: str,
            measurements: int = 1) -> Regression | None:
    if old is None or old.toolchain is None:
        return None
    levels = compare_levels(old.report, new, max_regression)
    if not any(lv.regressed for lv in levels):
        return None
    return Regression(digest, gpu, max_regression, toolchain_changes(old.toolchain, toolchain),
                      levels, role, measurements)


def confirmed(suspect: Regression, rounds: Sequence[Sequence[LoadLevel]]) -> Regression | None:
    """*suspect* (a regression by what this run measured so far: a smoke, or the gate's
    rounds) judged again with *rounds* measured here since (each a burst at every level): at
    each level the new figure becomes the fastest of what it was and the rounds' (module
    doc). None when no level is still below the line: the node slowed it, not the toolchain."""
    levels = []
    for level in suspect.levels:
        again = [found for one in rounds for measured in one
                 if measured.concurrency == level.concurrency
                 and (found := (figure(measured) if level.figure == ROBUST
                                else measured.output_tokens_per_s)) is not None]
        before = [level.new_tokens_per_s] if level.new_tokens_per_s is not None else []
        fastest = max(again + before, default=None)
        regressed = (fastest is not None and level.old_tokens_per_s is not None
                     and fastest < (1 - suspect.max_regression) * level.old_tokens_per_s)
        levels.append(replace(level, new_tokens_per_s=fastest, regressed=regressed,
                              rounds=suspect.measurements + len(again)))
    if not any(level.regressed for level in levels):
        return None
    return replace(suspect, levels=levels, measurements=suspect.measurements + len(rounds))


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
    *toolchain* (`Promotion.rule` "ab": its levels' old side is the incumbent's, and the
    fastest of its rounds is compared), against the incumbent's last proof on the previous
    fingerprint of *gpu*."""
    if promotion.rule != "ab" or promotion.old is None or not promotion.levels:
        return None
    measured = {"load": [{"concurrency": lv.concurrency, ROBUST: fastest, MEAN: fastest,
                          "median_ttft_s": lv.old_ttft_p50_s, "ttft_p50_s": lv.old_ttft_p50_s}
                         for lv in promotion.levels
                         if (fastest := lv.old_best_tokens_per_s or lv.old_tokens_per_s)
                         is not None]}
    old = previous_proof(smoke_records.smoke_reports(session, promotion.old), gpu, toolchain)
    rounds = max((lv.rounds or 1 for lv in promotion.levels), default=1)
    return _judged(promotion.old, gpu, max_regression, old, new=measured, toolchain=toolchain,
                   role="incumbent", measurements=rounds)


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
        "warm_cache": new_report.report.get("warm_cache"),
        "warm_use": new_report.report.get("warm_use")}
    return compare_levels(old_report.report if old_report else None,
                          new_report.report if new_report else None, None), start
