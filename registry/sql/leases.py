"""Leases: one row per stage key in `stage_runs` that a builder holds while it runs that
stage (then the run's outcome), and the nightly lease, one row that a whole `enginectl
nightly` holds so that two nightlies never requalify at once.

Every function takes a session or a Core connection (`registry.sql.rows.Executor`: a
heartbeat renews on a connection, without the ORM) and works inside the caller's
transaction; none commits.
Each take-over is one atomic statement, so of several processes racing exactly one wins.

Expiry is the database's clock, never a builder's: every lease time is the server's time
when the statement runs (`now()` on PostgreSQL, the time of the transaction, which a lease
statement has to itself; `'now'` on SQLite), so builders whose clocks disagree still agree
on who holds a lease. The `now=` parameters override it (tests).

A lease whose holder ran on this host and is gone (its pid no longer runs, or now names a
younger process) is taken over at once, without waiting for its expiry: a builder killed
with `kill -9` and run again proceeds immediately. Keep the heartbeat
(`registry.sql.heartbeat`) renewing a held lease; it notices when a lease was taken away.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from sqlalchemy import ColumnElement, func, literal, or_, select, type_coerce, update

from registry.sql.rows import dialect_of, insert_for
from registry.sql.tables import STAGE_RUNS, UTCDateTime

if TYPE_CHECKING:
    from registry.sql.rows import Executor

RunStatus = Literal["running", "succeeded", "failed", "cancelled"]

NIGHTLY_KEY: Final = "nightly"
"""The `stage_runs` key of the nightly lease (never a stage key: those start with `k1:`)."""
PID_REUSE_SLACK_S: Final = 60.0
"""A process younger than the lease by more than this cannot be its holder (pid reuse)."""


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


def _db_time(session: Executor, now: datetime | None = None,
             plus_s: float = 0.0) -> ColumnElement[datetime]:
    """The database's current time plus *plus_s*, evaluated by the statement it is part of
    (*now* instead, when given). SQLite stores times as text, to the microsecond."""
    if now is not None:
        return literal(now + timedelta(seconds=plus_s), UTCDateTime())
    if dialect_of(session) == "postgresql":
        return type_coerce(func.now() + literal(timedelta(seconds=plus_s)),
                           UTCDateTime())
    text = func.strftime("%Y-%m-%d %H:%M:%f", "now", f"{plus_s:+.3f} seconds").op("||")("000")
    return type_coerce(text, UTCDateTime())


def db_now(session: Executor) -> datetime:
    """The database's current time (UTC)."""
    found = session.execute(select(_db_time(session))).scalar_one()
    assert isinstance(found, datetime)  # noqa: S101 - UTCDateTime's result processor
    return found


def try_acquire_lease(
    session: Executor, key: str, *, owner: str, host: str, pid: int, ttl_s: float,
    now: datetime | None = None, node_id: str | None = None,
) -> bool:
    """Take the lease on stage *key* for *owner* until the database's now + *ttl_s*; True
    when taken.

    Taken when no run exists, the run is finished (succeeded or failed), its lease has
    expired (a dead builder), *owner* holds it already (the lease is renewed), or its holder
    ran on *host* (this host) and is gone (`holder_gone`). Each is one atomic statement: of
    several processes racing, exactly one wins. *node_id* is the Ray node that runs it (None
    off Ray); *host* is that node's hostname.
    """
    values: dict[str, Any] = {
        "key": key, "status": "running", "host": host, "pid": pid, "owner": owner,
        "started_at": _db_time(session, now), "finished_at": None,
        "lease_expires_at": _db_time(session, now, ttl_s),
        "artifact_digest": None, "log_location": None, "error": None, "node_id": node_id,
    }
    stmt = insert_for(session, STAGE_RUNS).values(values)
    stmt = stmt.on_conflict_do_update(
        index_elements=["key"],
        set_={name: value for name, value in values.items() if name != "key"},
        where=or_(
            STAGE_RUNS.c.status != "running",
            STAGE_RUNS.c.lease_expires_at <= _db_time(session, now),
            STAGE_RUNS.c.owner == owner,
        ),
    )
    if session.execute(stmt.returning(STAGE_RUNS.c.key)).first() is not None:
        return True
    held = get_stage_run(session, key)
    if held is None or held.status != "running" or held.host != host or held.pid == pid:
        return False
    age = ((now or db_now(session)) - held.started_at).total_seconds()
    if not holder_gone(held.pid, age):
        return False
    taken = session.execute(  # conditioned on the same holder: one racer wins
        update(STAGE_RUNS)
        .where(STAGE_RUNS.c.key == key, STAGE_RUNS.c.owner == held.owner,
               STAGE_RUNS.c.pid == held.pid, STAGE_RUNS.c.status == "running")
        .values({name: value for name, value in values.items() if name != "key"})
        .returning(STAGE_RUNS.c.key)
    )
    return taken.first() is not None


def holder_gone(pid: int, lease_age_s: float) -> bool:
    """Whether the process *pid* of this host, which took a lease *lease_age_s* ago, is gone:
    no such process, a zombie, or (pid reuse) a process younger than the lease. Unsure
    (another user's process, no /proc): not gone."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    with contextlib.suppress(OSError, ValueError, IndexError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rfind(")") + 2:].split()  # state, ppid, ..., starttime (22nd)
        if fields[0] == "Z":
            return True
        started_ticks = int(fields[19])
        uptime_s = float(Path("/proc/uptime").read_text().split()[0])
        process_age_s = uptime_s - started_ticks / os.sysconf("SC_CLK_TCK")
        return process_age_s + PID_REUSE_SLACK_S < lease_age_s
    return False


def renew_lease(
    session: Executor, key: str, *, owner: str, ttl_s: float, now: datetime | None = None
) -> bool:
    """Extend *owner*'s running lease on *key* to the database's now + *ttl_s*; False when
    it is no longer theirs."""
    result = session.execute(
        update(STAGE_RUNS)
        .where(STAGE_RUNS.c.key == key, STAGE_RUNS.c.owner == owner,
               STAGE_RUNS.c.status == "running")
        .values(lease_expires_at=_db_time(session, now, ttl_s))
        .returning(STAGE_RUNS.c.key)
    )
    return result.first() is not None


def release_lease(
    session: Executor, key: str, *, owner: str,
    status: Literal["succeeded", "failed", "cancelled"],
    artifact_digest: str | None = None, error: str | None = None,
    log_location: str | None = None, now: datetime | None = None,
) -> bool:
    """Finish *owner*'s run of *key* with its outcome; False (nothing written) when the
    lease was taken over by someone else meanwhile."""
    result = session.execute(
        update(STAGE_RUNS)
        .where(STAGE_RUNS.c.key == key, STAGE_RUNS.c.owner == owner,
               STAGE_RUNS.c.status == "running")
        .values(
            status=status, finished_at=_db_time(session, now),
            lease_expires_at=_db_time(session, now),
            artifact_digest=artifact_digest, error=error, log_location=log_location,
        )
        .returning(STAGE_RUNS.c.key)
    )
    return result.first() is not None


def cancel_run(
    session: Executor, key: str, *, owner: str, reason: str, now: datetime | None = None
) -> bool:
    """Mark *owner*'s run of *key* `cancelled` with *reason* (a driver's timeout, Ctrl-C):
    its lease is released, or a failure its worker recorded while being stopped is
    corrected. False (nothing written) when the run succeeded or belongs to someone else."""
    result = session.execute(
        update(STAGE_RUNS)
        .where(STAGE_RUNS.c.key == key, STAGE_RUNS.c.owner == owner,
               STAGE_RUNS.c.status.in_(("running", "failed")))
        .values(status="cancelled", finished_at=_db_time(session, now),
                lease_expires_at=_db_time(session, now), error=reason)
        .returning(STAGE_RUNS.c.key)
    )
    return result.first() is not None


def get_stage_run(session: Executor, key: str) -> StageRunRecord | None:
    row = session.execute(select(STAGE_RUNS).where(STAGE_RUNS.c.key == key)).first()
    return None if row is None else StageRunRecord(**row._asdict())


def get_stage_runs(session: Executor, keys: set[str]) -> dict[str, StageRunRecord]:
    """The stage runs of *keys* that exist, in one query."""
    if not keys:
        return {}
    query = select(STAGE_RUNS).where(STAGE_RUNS.c.key.in_(sorted(keys)))
    return {row.key: StageRunRecord(**row._asdict()) for row in session.execute(query)}


def try_acquire_nightly(session: Executor, *, owner: str, host: str, pid: int, ttl_s: float,
                        now: datetime | None = None) -> bool:
    """Take the nightly lease (see `try_acquire_lease`); True when taken."""
    return try_acquire_lease(session, NIGHTLY_KEY, owner=owner, host=host, pid=pid,
                             ttl_s=ttl_s, now=now)


def nightly_holder(session: Executor, now: datetime | None = None) -> StageRunRecord | None:
    """Who holds the nightly lease now, by the database's clock (None when no nightly
    runs)."""
    row = session.execute(
        select(STAGE_RUNS).where(
            STAGE_RUNS.c.key == NIGHTLY_KEY, STAGE_RUNS.c.status == "running",
            STAGE_RUNS.c.lease_expires_at > _db_time(session, now))
    ).first()
    return None if row is None else StageRunRecord(**row._asdict())
