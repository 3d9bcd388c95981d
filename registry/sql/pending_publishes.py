"""Rows of publishes in flight (`pending_publishes`): each names the blobs a publish relies
on, with an expiry its heartbeat renews; gc keeps every blob of a live row. The publish that
writes them, with its uploads and the gc lock, is `registry.ops.pending`.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Final

from sqlalchemy import delete, insert, select, update

from registry.identity.digest import Digest
from registry.sql.tables import PENDING_PUBLISHES, utcnow

if TYPE_CHECKING:
    from registry.sql.rows import Executor

TTL: Final = timedelta(hours=1)
"""How long a pending row protects its blobs without being renewed (`Pending.begin` takes
another, for tests); its heartbeat renews it every third of that."""


def add_pending(session: Executor, pending_id: str, *, owner: str, blobs: list[str],
                now: datetime | None = None, ttl: timedelta = TTL) -> None:
    now = now or utcnow()
    session.execute(insert(PENDING_PUBLISHES).values(
        id=pending_id, owner=owner, started_at=now, expires_at=now + ttl, blobs=blobs))


def renew_pending(session: Executor, pending_id: str, *, now: datetime | None = None,
                  ttl: timedelta = TTL) -> bool:
    result = session.execute(
        update(PENDING_PUBLISHES).where(PENDING_PUBLISHES.c.id == pending_id)
        .values(expires_at=(now or utcnow()) + ttl).returning(PENDING_PUBLISHES.c.id))
    return result.first() is not None


def drop_pending(session: Executor, pending_id: str) -> None:
    session.execute(delete(PENDING_PUBLISHES).where(PENDING_PUBLISHES.c.id == pending_id))


def live_pending_blobs(session: Executor, now: datetime) -> set[Digest]:
    """The blobs of every pending publish that has not expired at *now*: gc keeps them."""
    rows = session.scalars(select(PENDING_PUBLISHES.c.blobs)
                           .where(PENDING_PUBLISHES.c.expires_at > now))
    return {Digest.parse(blob) for blobs in rows for blob in blobs}


def drop_expired(session: Executor, now: datetime) -> int:
    """Remove the rows of publishes that died (expired at *now*); how many."""
    result = session.execute(delete(PENDING_PUBLISHES).where(PENDING_PUBLISHES.c.expires_at <= now)
                             .returning(PENDING_PUBLISHES.c.id))
    return len(result.all())
