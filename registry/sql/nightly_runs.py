"""The `nightly_runs` table: one row per `enginectl nightly` (who ran it, how it ended, its
report), and the last probe of every pool, which a nightly diffs its own probes with.

Every function takes a `Session` and works inside the caller's transaction; none commits.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import insert, select, update
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


def last_probes(session: Session) -> dict[str, ToolchainProbe]:
    """The newest recorded probe of every pool."""
    query = (select(ToolchainRow.pool, ToolchainRow.gpu, ToolchainRow.fingerprint,
                    ToolchainRow.host, ToolchainRow.probed_at, ToolchainRow.node_id)
             .order_by(ToolchainRow.probed_at, ToolchainRow.id))
    return {row.pool: ToolchainProbe(*row) for row in session.execute(query)}
