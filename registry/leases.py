"""Leases: one row per stage key in `stage_runs` that a builder holds while it runs that
stage (then the run's outcome), and the nightly lease, one row that a whole `enginectl
nightly` holds so that two nightlies never requalify at once.

Every function takes a `Session` and works inside the caller's transaction; none commits.
Each take-over is one atomic statement, so of several processes racing exactly one wins.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, Literal

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from registry.models import StageRun, utcnow
from registry.rows import insert_for

RunStatus = Literal["running", "succeeded", "failed", "cancelled"]

NIGHTLY_KEY: Final = "nightly"
"""The `stage_runs` key of the nightly lease (never a stage key: those start with `k1:`)."""


@dataclass(frozen=True, slots=True)
class StageRunRecord:
    key: str
    status: RunStatus
    host: str
    pid: int
    owner: str
    started_at: datetime
    finished_at: datetime | None
    lease_expires_at: datetime
    artifact_digest: str | None
    log_location: str | None
    error: str | None
    node_id: str | None = None


def try_acquire_lease(
    session: Session, key: str, *, owner: str, host: str, pid: int, ttl_s: float,
    now: datetime | None = None, node_id: str | None = None,
) -> bool:
    """Take the lease on stage *key* for *owner* until *now* + *ttl_s*; True when taken.

    Taken when no run exists, the run is finished (succeeded or failed), its lease has
    expired (a dead builder), or *owner* holds it already (the lease is renewed). One atomic
    statement: of several processes racing, exactly one wins. *now* is this host's clock;
    keep *ttl_s* well above the clock skew between builders. *node_id* is the Ray node that
    runs it (None off Ray); *host* is that node's hostname.
    """
    now = now or utcnow()
    values: dict[str, Any] = {
        "key": key, "status": "running", "host": host, "pid": pid, "owner": owner,
        "started_at": now, "finished_at": None, "lease_expires_at": now + timedelta(seconds=ttl_s),
        "artifact_digest": None, "log_location": None, "error": None, "node_id": node_id,
    }
    stmt = insert_for(session, StageRun).values(values)
    stmt = stmt.on_conflict_do_update(
        index_elements=["key"],
        set_={name: value for name, value in values.items() if name != "key"},
        where=or_(
            StageRun.status != "running", StageRun.lease_expires_at <= now,
            StageRun.owner == owner,
        ),
    )
    return session.execute(stmt.returning(StageRun.key)).first() is not None


def renew_lease(
    session: Session, key: str, *, owner: str, ttl_s: float, now: datetime | None = None
) -> bool:
    """Extend *owner*'s running lease on *key*; False when it is no longer theirs."""
    now = now or utcnow()
    result = session.execute(
        update(StageRun)
        .where(StageRun.key == key, StageRun.owner == owner, StageRun.status == "running")
        .values(lease_expires_at=now + timedelta(seconds=ttl_s))
        .returning(StageRun.key)
    )
    return result.first() is not None


def release_lease(
    session: Session, key: str, *, owner: str,
    status: Literal["succeeded", "failed", "cancelled"],
    artifact_digest: str | None = None, error: str | None = None,
    log_location: str | None = None, now: datetime | None = None,
) -> bool:
    """Finish *owner*'s run of *key* with its outcome; False (nothing written) when the
    lease was taken over by someone else meanwhile."""
    now = now or utcnow()
    result = session.execute(
        update(StageRun)
        .where(StageRun.key == key, StageRun.owner == owner, StageRun.status == "running")
        .values(
            status=status, finished_at=now, lease_expires_at=now,
            artifact_digest=artifact_digest, error=error, log_location=log_location,
        )
        .returning(StageRun.key)
    )
    return result.first() is not None


def cancel_run(
    session: Session, key: str, *, owner: str, reason: str, now: datetime | None = None
) -> bool:
    """Mark *owner*'s run of *key* `cancelled` with *reason* (a driver's timeout, Ctrl-C):
    its lease is released, or a failure its worker recorded while being stopped is
    corrected. False (nothing written) when the run succeeded or belongs to someone else."""
    now = now or utcnow()
    result = session.execute(
        update(StageRun)
        .where(StageRun.key == key, StageRun.owner == owner,
               StageRun.status.in_(("running", "failed")))
        .values(status="cancelled", finished_at=now, lease_expires_at=now, error=reason)
        .returning(StageRun.key)
    )
    return result.first() is not None


def get_stage_run(session: Session, key: str) -> StageRunRecord | None:
    row = session.execute(select(StageRun.__table__).where(StageRun.key == key)).first()
    return None if row is None else StageRunRecord(**row._asdict())


def get_stage_runs(session: Session, keys: set[str]) -> dict[str, StageRunRecord]:
    """The stage runs of *keys* that exist, in one query."""
    if not keys:
        return {}
    query = select(StageRun.__table__).where(StageRun.key.in_(sorted(keys)))
    return {row.key: StageRunRecord(**row._asdict()) for row in session.execute(query)}


def try_acquire_nightly(session: Session, *, owner: str, host: str, pid: int, ttl_s: float,
                        now: datetime | None = None) -> bool:
    """Take the nightly lease (see `try_acquire_lease`); True when taken."""
    return try_acquire_lease(session, NIGHTLY_KEY, owner=owner, host=host, pid=pid,
                             ttl_s=ttl_s, now=now)


def nightly_holder(session: Session) -> StageRunRecord | None:
    """Who holds the nightly lease now (None when no nightly runs)."""
    found = get_stage_run(session, NIGHTLY_KEY)
    if found is None or found.status != "running" or found.lease_expires_at <= utcnow():
        return None
    return found
