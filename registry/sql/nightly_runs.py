"""The `nightly_runs` table: one row per `enginectl nightly` (who ran it, how it ended, its
report), and the baseline a nightly diffs its own probes with (`baseline`).

Every function takes a `Session` and works inside the caller's transaction; none commits.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.orm import Session

from registry.sql.build_inputs import ToolchainProbe
from registry.sql.models import NightlyRun, ToolchainRow, utcnow


@dataclass(frozen=True, slots=True)
class NightlyRecord:
    id: int
    owner: str
    host: str
    started_at: datetime
    finished_at: datetime | None
    status: str
    exit_code: int | None


def start(session: Session, *, owner: str, host: str) -> int:
    """A row for a nightly that starts now (status `running`); its id."""
    run_id: int = session.execute(
        insert(NightlyRun).values(owner=owner, host=host, started_at=utcnow(),
                                  status="running").returning(NightlyRun.id)).scalar_one()
    return run_id


def finish(session: Session, run_id: int, *, status: str, exit_code: int,
           report: dict[str, Any]) -> None:
    session.execute(update(NightlyRun).where(NightlyRun.id == run_id).values(
        finished_at=utcnow(), status=status, exit_code=exit_code, report=report))


def last_finished(session: Session) -> NightlyRecord | None:
    """The newest nightly that ran to its end (not one stopped or broken; a dry run is
    never recorded)."""
    row = session.execute(
        select(NightlyRun.id, NightlyRun.owner, NightlyRun.host, NightlyRun.started_at,
               NightlyRun.finished_at, NightlyRun.status, NightlyRun.exit_code)
        .where(NightlyRun.status == "finished")
        .order_by(NightlyRun.started_at.desc(), NightlyRun.id.desc()).limit(1)).first()
    return None if row is None else NightlyRecord(*row)


def last_probes(session: Session, before: datetime | None = None) -> dict[str, ToolchainProbe]:
    """The newest recorded probe of every pool (made before *before*, when given)."""
    query = (select(ToolchainRow.pool, ToolchainRow.gpu, ToolchainRow.fingerprint,
                    ToolchainRow.host, ToolchainRow.probed_at, ToolchainRow.node_id)
             .order_by(ToolchainRow.probed_at, ToolchainRow.id))
    if before is not None:
        query = query.where(ToolchainRow.probed_at < before)
    return {row.pool: ToolchainProbe(*row) for row in session.execute(query)}


@dataclass(frozen=True, slots=True)
class Baseline:
    """What a nightly compares with: *probes*, each pool's toolchain as of *at* (None: now).
    The work of a bump is whatever the plan keyed with *probes* and the plan keyed now
    disagree on, and the proofs of that work are those made from *at* on."""

    at: datetime | None
    probes: dict[str, ToolchainProbe]


def settled(report: dict[str, Any] | None) -> bool:
    """Whether a finished nightly's *report* says it did all its work (`"settled"`, written
    by the nightly; a report without it is from before the field: settled)."""
    return bool((report or {}).get("settled", True))


def baseline(session: Session) -> Baseline:
    """The toolchain as the last *settled* nightly left it (one that finished and did every
    target's work: not killed, not failed, not holding promotions for a toolchain
    regression), at its end; before any nightly settled, as it was when the first nightly
    began; with no nightly ever, the newest probes. So a nightly killed or stopped after
    its probe leaves the baseline where it was, and the next one finds the same work."""
    at: datetime | None = None
    finished = session.execute(
        select(NightlyRun.id, NightlyRun.finished_at).where(NightlyRun.status == "finished")
        .order_by(NightlyRun.started_at.desc(), NightlyRun.id.desc())).all()
    for run_id, finished_at in finished:  # newest first: an unsettled streak is short
        report = session.execute(
            select(NightlyRun.report).where(NightlyRun.id == run_id)).scalar_one()
        if settled(report):
            at = finished_at
            break
    if at is None:
        at = session.execute(select(func.min(NightlyRun.started_at))).scalar_one_or_none()
    return Baseline(at, last_probes(session, before=at))
